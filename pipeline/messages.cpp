// Pipeline (pipeline.h): what crosses a stage boundary — an activation or its gradient with
// the skips that cross the same cut (models/skip.h), sent and received by a device's runner
// (device_runner.h) — and the executor's schedule of a step with fewer micro-batches than
// configured.
#include "common/error.h"
#include "common/strings.h"
#include "pipeline/executor.h"

namespace pipetrain::pipeline {

namespace {
// Part i of a message (0: the tensor, i >= 1: the i-th crossing skip in name order) travels on
// its own channel: the chunk in the low 8 bits, the part above them.
int channel(int chunk, int part) { return chunk + (part << 8); }

std::string join_keys(const Skips& skips) {
  std::vector<std::string> names;
  for (const auto& [name, t] : skips) names.push_back(name);
  return join(names, ", ");
}
}  // namespace

void check_crossing(const std::vector<std::vector<std::string>>& crossing, int chunks) {
  for (size_t b = 0; b < crossing.size(); ++b)
    if (crossing[b].size() > 62)
      throw ConfigError(detail::concat("pipeline: ", crossing[b].size(), " skips cross the cut after virtual stage ", b,
                                       "; at most 62 can"));
  if (chunks > 255) throw ConfigError(detail::concat("pipeline: at most 255 chunks, got ", chunks));
}

void DeviceRunner::send_across(comm::Kind kind, int to_vs, int boundary, int m, const at::Tensor& t,
                               const Skips& skips) {
  const int device = lists_->device_of(to_vs), chunk = lists_->chunk_of(to_vs);
  // In-process the receiver's context waits for this device's work so far. Between processes the
  // transport orders the transfer after the compute stream's work (NCCL: device to device) or
  // stages it through the host itself; one that takes only host memory gets a host copy.
  const stages::Marker produced = device != r_ && !wiring_.processes ? context_->mark() : stages::Marker{};
  auto put = [&](int part, const at::Tensor& x) {
    const comm::MessageId id{kind, m, channel(chunk, part), tag_step_};
    if (device == r_) {
      local_.put(kind, m, channel(chunk, part), x);
    } else if (!wiring_.processes) {
      if (wiring_.marking)  // only GPU contexts mark: no bookkeeping on the CPU's path
        wiring_.runners.at(device)->post_mark({static_cast<int>(kind), m, channel(chunk, part), tag_step_}, produced);
      endpoint_->send(device, id, x);
    } else {
      endpoint_->send(wiring_.ranks[device], id, endpoint_->takes(x.device()) ? x : context_->to_host(x));
    }
  };
  const auto& names = wiring_.crossing.at(boundary);
  if (skips.size() != names.size())
    throw Error(detail::concat("stage ", r_, ": ", skips.size(), skips.size() == 1 ? " skip crosses" : " skips cross",
                               " the cut after virtual stage ", boundary, " (", join_keys(skips), ") where the layer list declares ",
                               names.empty() ? std::string("none") : detail::concat(names.size(), " (", join(names, ", "), ")"),
                               " (layers that stash or pop say so, models::SkipDeclaring, or PipelineOptions::skips lists them)"));
  for (const auto& name : names)
    if (!skips.count(name))
      throw Error(detail::concat("stage ", r_, ": skip '", name, "' should cross the cut after virtual stage ", boundary,
                                 " but was not passed on"));
  // Checked before anything is sent, so that the next stage does not go on without the skips.
  put(0, t);
  for (size_t i = 0; i < names.size(); ++i) put(static_cast<int>(i) + 1, skips.at(names[i]));
}

at::Tensor DeviceRunner::recv_across(comm::Kind kind, int from_vs, int chunk_here, int boundary, int m, Skips* skips,
                                     std::vector<stages::Marker>& ready) {
  const int device = lists_->device_of(from_vs);
  auto get = [&](int part) {
    if (device == r_) return local_.take(kind, m, channel(chunk_here, part));
    const at::Tensor t = endpoint_->recv(wiring_.ranks[device], {kind, m, channel(chunk_here, part), tag_step_},
                                         Deadline::after(options_.timeout_s));
    stages::Marker produced;
    if (!wiring_.processes && wiring_.marking)
      produced = take_mark({static_cast<int>(kind), m, channel(chunk_here, part), tag_step_});
    stages::Received got = context_->receive(t, produced);
    ready.push_back(std::move(got.ready));
    return got.tensor;
  };
  at::Tensor t = get(0);
  const auto& names = wiring_.crossing.at(boundary);
  for (size_t i = 0; i < names.size(); ++i) (*skips)[names[i]] = get(static_cast<int>(i) + 1);
  return t;
}

const schedule::Schedule& Executor::schedule_for(int m) {
  if (m >= configured_.micro_batches) return configured_;
  auto it = fewer_.find(m);
  if (it != fewer_.end()) return it->second;
  for (int k = m; k >= 1; --k) {
    try {
      schedule::check_supported(options_.schedule, options_.stages, k, options_.chunks);
    } catch (const ScheduleError&) {
      continue;
    }
    schedule::Schedule s = schedule::pipeline_schedule(options_.schedule, options_.stages, k, options_.chunks, dp_.mesh.data_parallel);
    schedule::validate(s);
    check_delivery(s);
    return fewer_.emplace(m, std::move(s)).first->second;
  }
  std::string why;
  try {
    schedule::check_supported(options_.schedule, options_.stages, m, options_.chunks);
  } catch (const ScheduleError& e) {
    why = e.what();
  }
  throw ConfigError(detail::concat("pipeline: a batch that splits into at most ", m, " micro-batches", dp_.mesh.data_parallel > 1 ? " per copy" : "",
                                   " (fewer samples than the ", configured_.micro_batches, " configured) cannot run as ",
                                   options_.schedule, ": ", why, " (an epoch's last batch: data.drop_last skips it)"));
}

}  // namespace pipetrain::pipeline
