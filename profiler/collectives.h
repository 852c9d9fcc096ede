// The speed of data parallelism's gradient reduction on this machine: c10d Gloo collectives among
// D in-process members over loopback (comm/process_group.h) — the all-reduce of an unsharded
// optimizer, the reduce-scatter and all-gather of a sharded one — each timed at two sizes and
// fitted as a latency plus bytes over a bandwidth. The planner charges each stage's Reduce
// action (and a sharded optimizer's all-gather) this way (planner/plan.h).
#pragma once

namespace pipetrain::profiler {

// A collective over a flat tensor of `bytes` takes latency_ms + bytes / bytes_per_ms.
struct LinkFit {
  double latency_ms = 0;
  double bytes_per_ms = 0;  // 0: free
  // `speed`: this link's bandwidth relative to the fitted one.
  double time_ms(double bytes, double speed = 1) const {
    return bytes_per_ms > 0 ? latency_ms + bytes / (bytes_per_ms * speed) : 0.0;
  }
};

// Each fit takes the whole flat tensor's bytes (a reduce-scatter's input, an all-gather's output).
struct ReduceLink {
  LinkFit all_reduce, reduce_scatter, all_gather;
  // A sharded optimizer's reduction: the all-reduce (keeping a slice; pipetrain's choice on
  // Gloo, pipeline.h's ShardReduction) or the reduce-scatter.
  bool shard_by_all_reduce = false;
  const LinkFit& shard_reduce() const { return shard_by_all_reduce ? all_reduce : reduce_scatter; }
};

// Times float32 collectives of 256 KiB and 8 MiB among `members` threads (the median of `repeat`
// after one warm-up each), Gloo's, whose sharded reduction is an all-reduce. `members` < 2: a
// free link.
ReduceLink measure_reductions(int members, int repeat = 9, double timeout_s = 60);

// A link known only by its bandwidth and latency (a cost file's): ring collectives, an
// all-reduce moving 2(D-1)/D of the bytes and a reduce-scatter or all-gather (D-1)/D.
ReduceLink ring_link(int members, double latency_ms, double bytes_per_ms);

}  // namespace pipetrain::profiler
