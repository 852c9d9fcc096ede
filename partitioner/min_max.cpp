// Exact min-max partition (partition.h). Outline:
//  1. Instance: validated costs with prefix sums; every stage time and memory compared below is
//     computed here exactly as stage_time / stage_memory compute it.
//  2. MemoryEnds: for each stage with a limit and each start b, the furthest end within the limit
//     (memory grows with the end, so the ends that fit form an interval). Independent of time.
//  3. Prober: can every layer be covered by the stages with each stage time <= t? Boundaries
//     reachable after j stages are tracked exactly; where they provably form an interval a greedy
//     walk suffices. A probe also returns the bottleneck of a split it found (feasible) or the
//     smallest stage time above t that would change any of its decisions (infeasible).
//  4. Search: lo <= optimum <= hi, with hi always the bottleneck of a real split and lo raised
//     past every value proven infeasible; stops when they meet, so the result is a stage time.
//  5. Tie-break: a dynamic program over the boundaries that some optimal split can use.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "common/error.h"
#include "partitioner/partition.h"

namespace pipetrain::partitioner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Byte totals above this are refused so that no memory formula can overflow int64.
constexpr int64_t kMaxBytes = int64_t{1} << 62;
// Pair checks the tie-break may spend on stages whose memory is not monotone in the start.
constexpr int64_t kScanBudget = int64_t{1} << 22;

std::string layer_label(const std::vector<LayerCost>& costs, int i) {
  if (costs[i].name.empty()) return detail::concat("layer ", i);
  return detail::concat("layer ", i, " '", costs[i].name, "'");
}

class Instance {
 public:
  Instance(const std::vector<LayerCost>& costs, int stages, const Constraints& c)
      : costs(costs), model(c.memory), n(static_cast<int>(costs.size())), k(stages) {
    if (k < 1) throw ConfigError(detail::concat("partition: stages must be >= 1, got ", k));
    if (k > n)
      throw ConfigError(detail::concat("partition: ", k, " stages but the model has only ", n, " layers"));
    if (!c.devices.empty() && static_cast<int>(c.devices.size()) != k)
      throw ConfigError(detail::concat("partition: ", c.devices.size(), " devices given for ", k, " stages"));
    if (!model.in_flight.empty() && static_cast<int>(model.in_flight.size()) != k)
      throw ConfigError(detail::concat("partition: memory.in_flight has ", model.in_flight.size(),
                                       " entries for ", k, " stages"));
    if (!std::isfinite(model.state_factor) || model.state_factor < 0)
      throw ConfigError(detail::concat("partition: memory.state_factor is ", model.state_factor,
                                       "; it must be finite and >= 0"));
    if (model.input_bytes < 0 || model.input_bytes > kMaxBytes)
      throw ConfigError(detail::concat("partition: memory.input_bytes is ", model.input_bytes,
                                       "; it must be in [0, 2^62]"));
    speed.assign(k, 1.0);
    limit.assign(k, 0);
    in_flight.assign(k, 1);
    for (int j = 0; j < k; ++j) {
      if (!c.devices.empty()) {
        speed[j] = c.devices[j].speed;
        limit[j] = c.devices[j].memory_limit;
        if (!std::isfinite(speed[j]) || speed[j] <= 0)
          throw ConfigError(detail::concat("partition: device ", j, " has speed ", speed[j],
                                           "; speeds must be finite and > 0"));
        if (limit[j] < 0)
          throw ConfigError(detail::concat("partition: device ", j, " has memory_limit ", limit[j],
                                           "; it must be >= 0 (0 = no limit)"));
      }
      if (!model.in_flight.empty()) {
        in_flight[j] = model.in_flight[j];
        if (in_flight[j] < 1)
          throw ConfigError(
              detail::concat("partition: memory.in_flight[", j, "] is ", in_flight[j], "; it must be >= 1"));
      }
    }
    sum_ms.assign(n + 1, 0.0);
    sum_params.assign(n + 1, 0);
    sum_trained.assign(n + 1, 0);
    sum_saved.assign(n + 1, 0);
    int64_t max_input = model.input_bytes, max_workspace = 0;
    for (int i = 0; i < n; ++i) {
      const LayerCost& l = costs[i];
      for (double v : {l.forward_ms, l.backward_ms})
        if (!std::isfinite(v) || v < 0)
          throw ConfigError(detail::concat("partition: ", layer_label(costs, i), " has time ", v,
                                           " ms; times must be finite and >= 0"));
      if (l.trainable_bytes > l.param_bytes)
        throw ConfigError(detail::concat("partition: ", layer_label(costs, i), " has ", l.trainable_bytes, " trainable bytes of ",
                                         l.param_bytes, " parameter bytes"));
      for (int64_t v : {l.param_bytes, l.activation_bytes, l.saved_bytes, l.workspace_bytes})
        if (v < 0 || v > kMaxBytes - std::max(sum_params[i], sum_saved[i]))
          throw ConfigError(detail::concat("partition: ", layer_label(costs, i), " has ", v,
                                           " bytes; byte counts must be >= 0 and sum below 2^62"));
      sum_ms[i + 1] = sum_ms[i] + layer_ms(l);
      sum_params[i + 1] = sum_params[i] + l.param_bytes;
      sum_trained[i + 1] = sum_trained[i] + l.trained_bytes();
      sum_saved[i + 1] = sum_saved[i] + l.saved_bytes;
      max_input = std::max(max_input, l.activation_bytes);
      max_workspace = std::max(max_workspace, l.workspace_bytes);
    }
    // The largest workspace of a range of layers in O(1): a sparse table, built only when some
    // layer has one (level t holds the maximum of 2^t layers from each start).
    if (max_workspace > 0) {
      workspace_.push_back({});
      for (const auto& l : costs) workspace_[0].push_back(l.workspace_bytes);
      for (int t = 1; (1 << t) <= n; ++t) {
        const auto& prev = workspace_[t - 1];
        std::vector<int64_t> level(n - (1 << t) + 1);
        for (size_t i = 0; i < level.size(); ++i) level[i] = std::max(prev[i], prev[i + (1 << (t - 1))]);
        workspace_.push_back(std::move(level));
      }
    }
    if (!std::isfinite(sum_ms[n]))
      throw ConfigError("partition: the layer times sum to more than a double can hold");
    const int max_f = *std::max_element(in_flight.begin(), in_flight.end());
    const double bound = static_cast<double>(sum_params[n]) + static_cast<double>(sum_trained[n]) * model.state_factor +
                         static_cast<double>(max_f) * (static_cast<double>(sum_saved[n]) + max_input) +
                         static_cast<double>(max_workspace);
    if (!(bound < static_cast<double>(kMaxBytes)))
      throw ConfigError(detail::concat("partition: the memory of one stage could reach ", bound,
                                       " bytes, beyond the 2^62 this model computes with"));
    max_bytes = static_cast<int64_t>(bound) + 1;
  }

  double time(int j, int b, int e) const { return (sum_ms[e] - sum_ms[b]) / speed[j]; }
  int64_t input(int b) const { return b == 0 ? model.input_bytes : costs[b - 1].activation_bytes; }
  int64_t memory(int j, int b, int e) const {
    return memory_bytes(sum_params[e] - sum_params[b], sum_saved[e] - sum_saved[b], input(b), in_flight[j], model,
                        sum_trained[e] - sum_trained[b]) +
           workspace(b, e);
  }
  // The largest workspace_bytes of layers [b, e); it only grows as a stage takes more layers, so
  // the probes' monotonicity in the stage's start and end holds with it.
  int64_t workspace(int b, int e) const {
    if (workspace_.empty()) return 0;
    const int t = 31 - __builtin_clz(static_cast<unsigned>(e - b));  // floor(log2(e - b))
    return std::max(workspace_[t][b], workspace_[t][e - (1 << t)]);
  }
  // Whether stage j's memory cannot grow when its start moves later (the input term is the only
  // part that depends on the start alone).
  bool start_monotone(int j) const {
    switch (model.recompute) {
      case Recompute::Never:
        return true;
      case Recompute::ExceptLast:
        return in_flight[j] == 1;
      case Recompute::Always:
        return false;
    }
    return false;
  }

  const std::vector<LayerCost>& costs;
  const MemoryModel& model;
  int n, k;
  std::vector<double> speed;
  std::vector<int64_t> limit;  // 0 = none
  std::vector<int> in_flight;
  std::vector<double> sum_ms;  // running sums of layer_ms, as stage_time accumulates them
  std::vector<int64_t> sum_params, sum_trained, sum_saved;
  std::vector<std::vector<int64_t>> workspace_;  // sparse table of workspace_bytes; empty: all 0
  int64_t max_bytes = 0;  // no stage of any split can need more
};

// For each stage with a limit and each start b: the furthest end e with memory(j, b, e) <= limit
// (b when the layer alone does not fit). Stages with equal limit and in_flight share a table.
class MemoryEnds {
 public:
  MemoryEnds(const Instance& in, std::vector<int64_t> limits)
      : in_(in), limits_(std::move(limits)), table_(in.k, -1) {
    std::map<std::pair<int64_t, int>, int> seen;
    std::vector<int> first_stage;  // per table: a stage that uses it
    for (int j = 0; j < in.k; ++j) {
      if (limits_[j] == 0) continue;
      monotone_ = monotone_ && in.start_monotone(j);
      const auto key = std::make_pair(limits_[j], in.in_flight[j]);
      auto it = seen.find(key);
      if (it == seen.end()) {
        it = seen.emplace(key, static_cast<int>(first_stage.size())).first;
        first_stage.push_back(j);
      }
      table_[j] = it->second;
    }
    ends_.assign(first_stage.size(), std::vector<int>(in.n));
    std::vector<int> shifted;  // tables whose stage input term varies with the start
    for (size_t x = 0; x < first_stage.size(); ++x) {
      if (in.start_monotone(first_stage[x]))
        build_monotone(first_stage[x], ends_[x]);
      else
        shifted.push_back(static_cast<int>(x));
    }
    build_shifted(shifted, first_stage);
  }

  int end(int j, int b) const { return table_[j] < 0 ? in_.n : ends_[table_[j]][b]; }
  int64_t limit(int j) const { return limits_[j]; }
  bool limited(int j) const { return limits_[j] != 0; }
  // Stage j's feasible ends shrink as its start moves earlier (so split costs are Monge).
  bool monotone(int j) const { return !limited(j) || in_.start_monotone(j); }
  bool all_monotone() const { return monotone_; }
  // Some layer alone exceeds the limit of some stage.
  bool gap() const { return gap_; }

 private:
  // Largest e' >= e with memory(j, b, e') <= limit (e itself is known to fit or equals b).
  int furthest(int j, int b, int e) const {
    const int64_t cap = limits_[j];
    int lo = e, step = 1;
    while (lo + step <= in_.n && in_.memory(j, b, lo + step) <= cap) lo += step, step *= 2;
    int hi = std::min(in_.n, lo + step - 1);
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (in_.memory(j, b, mid) <= cap)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  // Ends never move back as the start moves on: a running pointer.
  void build_monotone(int j, std::vector<int>& ends) {
    int e = 0;
    for (int b = 0; b < in_.n; ++b) {
      e = std::max(e, b);
      while (e < in_.n && in_.memory(j, b, e + 1) <= limits_[j]) ++e;
      ends[b] = e;
      gap_ = gap_ || e == b;
    }
  }

  // memory(j, b, e) = base(b, e) + c_j * input(b), with base the same for every stage (recompute
  // Always or ExceptLast), so at a fixed start the tables' ends are ordered by what their limit
  // leaves for base, limit_j - c_j * input(b): each search continues from the previous end.
  void build_shifted(const std::vector<int>& tables, const std::vector<int>& first_stage) {
    if (tables.empty()) return;
    auto coef = [&](int x) {
      const int f = in_.in_flight[first_stage[x]];
      return static_cast<int64_t>(in_.model.recompute == Recompute::Always ? f : f - 1);
    };
    std::vector<int> order = tables;
    bool same_limit = true;
    for (int x : tables)
      same_limit = same_limit && limits_[first_stage[x]] == limits_[first_stage[tables[0]]];
    // With one limit the order is by coefficient, largest first, for every start.
    if (same_limit) std::sort(order.begin(), order.end(), [&](int x, int y) { return coef(x) > coef(y); });
    for (int b = 0; b < in_.n; ++b) {
      auto room = [&](int x) { return limits_[first_stage[x]] - coef(x) * in_.input(b); };
      if (!same_limit) std::sort(order.begin(), order.end(), [&](int x, int y) { return room(x) < room(y); });
      int e = b;
      for (int x : order) {
        e = furthest(first_stage[x], b, e);
        ends_[x][b] = e;
        gap_ = gap_ || e == b;
      }
    }
  }

  const Instance& in_;
  std::vector<int64_t> limits_;
  std::vector<int> table_;  // per stage: index into ends_, -1 = no limit
  std::vector<std::vector<int>> ends_;
  bool monotone_ = true, gap_ = false;
};

struct ProbeResult {
  bool feasible = false;
  double achieved = kInf;  // feasible: the bottleneck of the split found (<= t)
  double next = kInf;      // infeasible: every t' below this is infeasible too
};

// Feasibility of a bottleneck t. Boundary j is where stage j starts (0 for j = 0, n for j = k);
// R_j, the boundaries some valid choice of the first j stages reaches, lies in [j, n - (k - j)].
// From a start b, stage j may end anywhere in (b, M_j(b)], M_j(b) = min(time end, memory end,
// n - (k - 1 - j)), because time and memory only grow with the end. M_j is nondecreasing in b
// when memory is monotone in the start; if also every layer fits every stage alone (t >= t_gap,
// no memory gap), R_j is the interval [j, h_j] and h_{j+1} = M_j(h_j): the greedy walk.
// Otherwise (a heavy layer that only a fast stage takes, an input that only some starts can
// afford) R_j can have holes and the sweep tracks it as a bit row.
class Prober {
 public:
  Prober(const Instance& in, const MemoryEnds& mem) : in_(in), mem_(mem) {
    double max_ms = 0;
    for (int b = 0; b < in.n; ++b) max_ms = std::max(max_ms, in.sum_ms[b + 1] - in.sum_ms[b]);
    t_gap_ = max_ms / *std::min_element(in.speed.begin(), in.speed.end());
    greedy_ok_ = mem.all_monotone() && !mem.gap();
  }

  ProbeResult operator()(double t) { return greedy_ok_ && t >= t_gap_ ? greedy(t) : sweep(t); }

  // The boundaries (size k + 1) of a split the last feasible probe found.
  std::vector<int> split() const {
    if (last_greedy_) return start_;
    std::vector<int> bounds(in_.k + 1, in_.n);
    for (int j = in_.k; j > 0; --j) bounds[j - 1] = pred_[row(j) + bounds[j]];
    return bounds;
  }

  // For each boundary j, the sorted positions it takes in some split whose stage times are all
  // <= t (t must be feasible).
  std::vector<std::vector<int>> windows(double t) {
    const ProbeResult r = (*this)(t);
    PIPETRAIN_CHECK(r.feasible, "windows at an infeasible bottleneck");
    const int n = in_.n, k = in_.k;
    std::vector<std::vector<int>> w(k + 1);
    w[k] = {n};
    if (last_greedy_) {
      // V_j, the boundaries from which the remaining stages can finish, is [g_j, n - (k - j)]:
      // g_j is the earliest start from which stage j reaches g_{j+1}.
      int g = n;
      for (int j = k - 1; j >= 0; --j) {
        int lo = j, hi = g - 1;
        while (lo < hi) {
          const int mid = lo + (hi - lo) / 2;
          if (in_.time(j, mid, g) <= t && g <= mem_.end(j, mid))
            hi = mid;
          else
            lo = mid + 1;
        }
        g = lo;
        for (int b = g; b <= start_[j]; ++b) w[j].push_back(b);
      }
    } else {
      for (int j = k - 1; j >= 0; --j) {
        const std::vector<int>& after = w[j + 1];
        const char* cur = &reach_[row(j)];
        const int cap = n - (k - 1 - j);
        size_t next_after = 0;
        int te = 0;
        for (int b = lo_[j]; b <= hi_[j]; ++b) {
          if (!cur[b]) continue;
          te = std::max(te, b);
          while (te < n && in_.time(j, b, te + 1) <= t) ++te;
          while (next_after < after.size() && after[next_after] <= b) ++next_after;
          if (next_after < after.size() && after[next_after] <= std::min({te, mem_.end(j, b), cap}))
            w[j].push_back(b);
        }
      }
    }
    return w;
  }

 private:
  size_t row(int j) const { return static_cast<size_t>(j) * (in_.n + 1); }

  // Largest e in [b, n] with time(j, b, e) <= t.
  int time_end(int j, int b, double t) const {
    int lo = b, step = 1;
    while (lo + step <= in_.n && in_.time(j, b, lo + step) <= t) lo += step, step *= 2;
    int hi = std::min(in_.n, lo + step - 1);
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (in_.time(j, b, mid) <= t)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  ProbeResult greedy(double t) {
    last_greedy_ = true;
    const int n = in_.n, k = in_.k;
    start_.assign(k + 1, 0);
    ProbeResult r;
    double worst = 0;
    int b = 0;
    for (int j = 0; j < k; ++j) {
      const int cap = n - (k - 1 - j);
      const int te = time_end(j, b, t);
      const int bound = std::min(mem_.end(j, b), cap);
      if (te < bound) r.next = std::min(r.next, in_.time(j, b, te + 1));
      const int e = std::min(te, bound);
      PIPETRAIN_CHECK(e > b, "greedy probe: stage ", j, " cannot take layer ", b);
      worst = std::max(worst, in_.time(j, b, e));
      start_[j + 1] = b = e;
    }
    r.feasible = b == n;
    if (r.feasible) r.achieved = worst;
    return r;
  }

  // Lower bounds L_j on the boundaries from which stages j..k-1 can finish within t on time
  // alone (empty stages allowed, memory ignored): L_k = n, L_j = the earliest b with
  // time(j, b, L_{j+1}) <= t. They only change when t reaches time(j, L_j - 1, L_{j+1}), which
  // goes into `next` so that pruning below L_j keeps the probe's answer constant up to `next`.
  void time_floor(double t, ProbeResult& r) {
    floor_.assign(in_.k + 1, in_.n);
    for (int j = in_.k - 1; j >= 0; --j) {
      const int e = floor_[j + 1];
      int lo = 0, hi = e;
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (in_.time(j, mid, e) <= t)
          hi = mid;
        else
          lo = mid + 1;
      }
      floor_[j] = lo;
      if (lo > 0) r.next = std::min(r.next, in_.time(j, lo - 1, e));
    }
  }

  ProbeResult sweep(double t) {
    last_greedy_ = false;
    const int n = in_.n, k = in_.k;
    if (reach_.empty()) {
      reach_.assign(row(k + 1), 0);
      pred_.assign(row(k + 1), 0);
      lo_.assign(k + 1, 0);
      hi_.assign(k + 1, 0);
    }
    reach_[0] = 1;
    ProbeResult r;
    time_floor(t, r);
    if (floor_[0] > 0) return r;
    for (int j = 0; j < k; ++j) {
      const int cap = n - (k - 1 - j);
      const char* cur = &reach_[row(j)];
      char* nxt = &reach_[row(j + 1)];
      int* pred = &pred_[row(j + 1)];
      const int low = std::max(lo_[j] + 1, floor_[j + 1]);  // row j + 1 is read from here on
      if (low > cap) return r;
      std::memset(nxt + low, 0, cap - low + 1);
      int marked = low - 1, first = -1, te = 0;
      for (int b = lo_[j]; b <= hi_[j]; ++b) {
        if (!cur[b]) continue;
        te = std::max(te, b);
        while (te < n && in_.time(j, b, te + 1) <= t) ++te;
        const int bound = std::min(mem_.end(j, b), cap);
        if (te < bound) r.next = std::min(r.next, in_.time(j, b, te + 1));
        const int e = std::min(te, bound);
        if (e <= marked) continue;
        const int from = std::max(b + 1, marked + 1);
        if (first < 0) first = from;
        for (int x = from; x <= e; ++x) nxt[x] = 1, pred[x] = b;
        marked = e;
      }
      if (first < 0) return r;
      lo_[j + 1] = first;
      hi_[j + 1] = marked;
    }
    r.feasible = hi_[k] == n;
    if (r.feasible) {
      const std::vector<int> bounds = split();
      r.achieved = 0;
      for (int j = 0; j < k; ++j) r.achieved = std::max(r.achieved, in_.time(j, bounds[j], bounds[j + 1]));
    }
    return r;
  }

  const Instance& in_;
  const MemoryEnds& mem_;
  double t_gap_ = 0;  // every layer alone fits every stage's time at t >= t_gap_
  bool greedy_ok_ = false, last_greedy_ = false;
  std::vector<int> start_;   // greedy: boundaries of the split found
  std::vector<char> reach_;  // sweep: row j = R_j as bits (valid within [lo_[j], hi_[j]])
  std::vector<int> pred_;    // sweep: row j + 1, entry e = a start of stage j that reaches e
  std::vector<int> lo_, hi_;
  std::vector<int> floor_;  // sweep: L_j, see time_floor
};

// The smallest bottleneck, searched between a lower bound and the bottleneck of a real split.
double search(const Instance& in, Prober& probe, double hi) {
  const int n = in.n;
  double max_ms = 0, total_speed = 0;
  for (int b = 0; b < n; ++b) max_ms = std::max(max_ms, in.sum_ms[b + 1] - in.sum_ms[b]);
  for (double s : in.speed) total_speed += s;
  // Each layer takes at least its time on the fastest device; the stage times cannot all be
  // below the even share (with a margin for rounding, far above the error of the sums).
  double lo = std::max(max_ms / *std::max_element(in.speed.begin(), in.speed.end()),
                       in.sum_ms[n] / total_speed * (1 - 1e-9));
  lo = std::min(lo, hi);
  while (lo < hi) {
    double mid = lo + (hi - lo) / 2;
    if (!(mid < hi)) mid = lo;
    const ProbeResult r = probe(mid);
    if (r.feasible)
      hi = r.achieved;
    else
      lo = r.next;
  }
  PIPETRAIN_CHECK(lo == hi, "bottleneck search ended with ", lo, " > ", hi);
  return hi;
}

// Boundaries (size k + 1) of the split with all stage times <= t that minimises
// sum of speed * time^2; nullopt, before any work, when the exact scan would exceed its budget.
class Balancer {
 public:
  Balancer(const Instance& in, const MemoryEnds& mem, double t) : in_(in), mem_(mem), t_(t) {}

  std::optional<std::vector<int>> run(const std::vector<std::vector<int>>& w) {
    const int k = in_.k;
    if (scan_pairs(w) > kScanBudget) return std::nullopt;
    std::vector<std::vector<int>> arg(k + 1);
    dp_prev_.assign(1, 0.0);
    for (int j = 0; j < k; ++j) {
      j_ = j;
      before_ = &w[j];
      after_ = &w[j + 1];
      dp_.assign(after_->size(), kInf);
      arg_ = &arg[j + 1];
      arg_->assign(after_->size(), -1);
      if (mem_.monotone(j)) {
        divide(0, static_cast<int>(after_->size()) - 1, 0, static_cast<int>(before_->size()) - 1);
      } else {
        for (size_t ei = 0; ei < after_->size(); ++ei) {
          const int e = (*after_)[ei];
          int i =
              static_cast<int>(std::lower_bound(before_->begin(), before_->end(), e) - before_->begin()) - 1;
          for (; i >= 0 && in_.time(j, (*before_)[i], e) <= t_; --i) {
            const double v = cost(i, e);
            if (v <= dp_[ei]) dp_[ei] = v, (*arg_)[ei] = i;
          }
        }
      }
      for (size_t ei = 0; ei < after_->size(); ++ei)
        PIPETRAIN_CHECK((*arg_)[ei] >= 0, "no start for boundary ", (*after_)[ei], " of stage ", j);
      dp_prev_.swap(dp_);
    }
    std::vector<int> bounds(k + 1, in_.n);
    int idx = 0;
    for (int j = k; j > 0; --j) {
      idx = arg[j][idx];
      bounds[j - 1] = w[j - 1][idx];
    }
    return bounds;
  }

 private:
  // The (start, end) pairs within t on time that the exact scan would check, on the stages whose
  // memory is not monotone in the start. Both ends of each end's range only move on: two pointers.
  int64_t scan_pairs(const std::vector<std::vector<int>>& w) const {
    int64_t pairs = 0;
    for (int j = 0; j < in_.k; ++j) {
      if (mem_.monotone(j)) continue;
      const std::vector<int>& b = w[j];
      size_t first = 0, end = 0;  // the range [first, end) of b within t of e and before e
      for (int e : w[j + 1]) {
        while (end < b.size() && b[end] < e) ++end;
        while (first < end && in_.time(j, b[first], e) > t_) ++first;
        pairs += static_cast<int64_t>(end - first);
      }
    }
    return pairs;
  }

  // dp of the boundary before_[i] plus stage j over [before_[i], e); kInf when not allowed.
  double cost(int i, int e) const {
    const int b = (*before_)[i];
    if (b >= e || e > mem_.end(j_, b)) return kInf;
    const double s = in_.time(j_, b, e);
    if (s > t_) return kInf;
    return dp_prev_[i] + s * s * in_.speed[j_];
  }

  // Costs are Monge (convex in a prefix-sum difference, with allowed pairs a staircase), so the
  // leftmost best start never moves back as the end moves on: divide and conquer over the ends.
  // Every end in the window has an allowed start in [ilo, ihi], whatever the rounding of the
  // costs, because the best start of a later (earlier) end also reaches this one.
  void divide(int elo, int ehi, int ilo, int ihi) {
    if (elo > ehi) return;
    const int mid = elo + (ehi - elo) / 2;
    const int e = (*after_)[mid];
    double best = kInf;
    int arg = -1;
    for (int i = ilo; i <= ihi && (*before_)[i] < e; ++i) {
      const double v = cost(i, e);
      if (v < best) best = v, arg = i;
    }
    PIPETRAIN_CHECK(arg >= 0, "no start for boundary ", e, " of stage ", j_);
    dp_[mid] = best;
    (*arg_)[mid] = arg;
    divide(elo, mid - 1, ilo, arg);
    divide(mid + 1, ehi, arg, ihi);
  }

  const Instance& in_;
  const MemoryEnds& mem_;
  const double t_;
  int j_ = 0;
  const std::vector<int>* before_ = nullptr;
  const std::vector<int>* after_ = nullptr;
  std::vector<int>* arg_ = nullptr;
  std::vector<double> dp_prev_, dp_;
};

// Throws when some layer's own bytes (parameters, state, saved tensors; no stage input) exceed
// the limit of every stage it can be placed on: any stage holding the layer needs at least that.
void check_layers_fit(const Instance& in, const MemoryEnds& mem) {
  for (int b = 0; b < in.n; ++b) {
    const LayerCost& l = in.costs[b];
    bool fits = false;
    int closest = -1;  // the stage it misses by the least
    int64_t closest_excess = 0, closest_bytes = 0;
    for (int j = std::max(0, b - (in.n - in.k)); j <= std::min(b, in.k - 1) && !fits; ++j) {
      const int64_t bytes = memory_bytes(l.param_bytes, l.saved_bytes, 0, in.in_flight[j], in.model, l.trained_bytes()) + l.workspace_bytes;
      fits = !mem.limited(j) || bytes <= mem.limit(j);
      if (!fits && (closest < 0 || bytes - mem.limit(j) < closest_excess))
        closest = j, closest_excess = bytes - mem.limit(j), closest_bytes = bytes;
    }
    if (!fits)
      throw ConfigError(detail::concat("partition: ", layer_label(in.costs, b), " alone needs ",
                                       closest_bytes, " bytes on stage ", closest,
                                       ", over its memory limit of ", mem.limit(closest),
                                       " bytes, and fits no other stage it can be placed on"));
  }
}

// No split fits: find the smallest excess over the limits that some split needs, and say so.
[[noreturn]] void throw_no_fit(const Instance& in) {
  auto limits_plus = [&](int64_t extra) {
    std::vector<int64_t> l = in.limit;
    for (int64_t& x : l)
      if (x != 0 && x < in.max_bytes) x += extra;
    return l;
  };
  int64_t lo = 1, hi = in.max_bytes;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    MemoryEnds mem(in, limits_plus(mid));
    if (Prober(in, mem)(kInf).feasible)
      hi = mid;
    else
      lo = mid + 1;
  }
  MemoryEnds mem(in, limits_plus(lo));
  Prober probe(in, mem);
  PIPETRAIN_CHECK(probe(kInf).feasible, "no split within the limits plus ", lo);
  const std::vector<int> bounds = probe.split();
  int worst = -1;
  for (int j = 0; j < in.k; ++j)
    if (in.limit[j] != 0 &&
        (worst < 0 || in.memory(j, bounds[j], bounds[j + 1]) - in.limit[j] >
                          in.memory(worst, bounds[worst], bounds[worst + 1]) - in.limit[worst]))
      worst = j;
  throw ConfigError(detail::concat("partition: no split of ", in.n, " layers into ", in.k,
                                   " stages fits the memory limits; the best one needs ",
                                   in.memory(worst, bounds[worst], bounds[worst + 1]), " bytes on stage ",
                                   worst, " (layers ", bounds[worst], "-", bounds[worst + 1] - 1,
                                   "), over its limit of ", in.limit[worst], " bytes"));
}

}  // namespace

Plan min_max(const std::vector<LayerCost>& costs, int stages, const Constraints& constraints) {
  const Instance in(costs, stages, constraints);
  const MemoryEnds mem(in, in.limit);
  check_layers_fit(in, mem);
  Prober probe(in, mem);
  const ProbeResult any = probe(kInf);
  if (!any.feasible) throw_no_fit(in);
  const double best = search(in, probe, any.achieved);

  std::optional<std::vector<int>> bounds = Balancer(in, mem, best).run(probe.windows(best));
  if (!bounds) bounds = probe.split();  // windows() left a split at `best` behind

  Plan plan;
  for (int j = 0; j < in.k; ++j) {
    const int b = (*bounds)[j], e = (*bounds)[j + 1];
    plan.balance.push_back(e - b);
    plan.stage_ms.push_back(in.time(j, b, e));
    plan.stage_bytes.push_back(in.memory(j, b, e));
    PIPETRAIN_CHECK(e > b && plan.stage_ms.back() <= best, "stage ", j, " of the split");
    PIPETRAIN_CHECK(!mem.limited(j) || plan.stage_bytes.back() <= mem.limit(j), "stage ", j, " memory");
  }
  plan.bottleneck_ms = *std::max_element(plan.stage_ms.begin(), plan.stage_ms.end());
  PIPETRAIN_CHECK(plan.bottleneck_ms == best, plan.bottleneck_ms, " != ", best);
  return plan;
}

Balance by_weights(const std::vector<double>& weights, int stages) {
  std::vector<LayerCost> costs(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0)
      throw ConfigError(
          detail::concat("partition: weight ", i, " is ", weights[i], "; weights must be finite and >= 0"));
    costs[i].forward_ms = weights[i];
  }
  return min_max(costs, stages).balance;
}

}  // namespace pipetrain::partitioner
