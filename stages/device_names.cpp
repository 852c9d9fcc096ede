// Device names (device.h): pipeline.devices resolved and checked against the accelerator report
// (accelerator.h). libtorch's c10 only (no ATen), so that the config reader stays light (the config
// fuzzer compiles it).
#include <algorithm>
#include <optional>

#include "common/error.h"
#include "stages/accelerator.h"
#include "stages/device.h"

namespace pipetrain::stages {

namespace {

std::string gpus_seen(int gpus, const std::string& why_none) {
  if (gpus == 0) return detail::concat("this process sees no CUDA device (", why_none, ")");
  return detail::concat("this process sees ", gpus, " CUDA device", gpus == 1 ? "" : "s", " (cuda:0",
                        gpus > 1 ? detail::concat(" to cuda:", gpus - 1) : std::string(), ")");
}

c10::Device parse_device_on(const std::string& name, const std::string& where, const AcceleratorInfo& acc) {
  std::optional<c10::Device> parsed;
  try {
    parsed.emplace(name);
  } catch (const c10::Error&) {
  }
  if (!parsed || !(parsed->is_cpu() || parsed->is_cuda()))
    throw ConfigError(detail::concat(where, ": unknown device \"", name, "\"; stages run on \"cpu\" or \"cuda\" (\"cuda:N\" for the N-th GPU)"));
  if (parsed->is_cpu()) return c10::Device(c10::kCPU);
  if (!acc.cuda)
    throw ConfigError(detail::concat(where, ": \"", name, "\" needs CUDA, but this build has none (its libtorch has no CUDA)"));
  const int index = parsed->has_index() ? parsed->index() : 0;
  if (index >= acc.gpus)
    throw ConfigError(detail::concat(where, ": \"", name, "\" does not exist: ", gpus_seen(acc.gpus, acc.no_gpu_reason)));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

c10::Device parse_device(const std::string& name, const std::string& where) {
  if (name == "cpu") return c10::Device(c10::kCPU);  // no need to ask CUDA
  return parse_device_on(name, where, accelerator_info());
}

bool StageDevices::any_cuda() const {
  return std::any_of(per_stage.begin(), per_stage.end(), [](const c10::Device& d) { return d.is_cuda(); });
}

bool StageDevices::any_cpu() const {
  return std::any_of(per_stage.begin(), per_stage.end(), [](const c10::Device& d) { return d.is_cpu(); });
}

StageDevices resolve_devices(const std::vector<std::string>& names, int stages, const std::string& where,
                             int local_rank) {
  // The accelerator is asked only when a name needs it, as parse_device does.
  const bool cpu_only = std::all_of(names.begin(), names.end(), [](const std::string& n) { return n == "cpu"; });
  return resolve_devices(names, stages, where, local_rank, cpu_only && !names.empty() ? AcceleratorInfo{} : accelerator_info());
}

StageDevices resolve_devices(const std::vector<std::string>& names, int stages, const std::string& where,
                             int local_rank, const AcceleratorInfo& acc) {
  StageDevices out;
  out.asked_auto = names.size() == 1 && names[0] == "auto";
  out.chosen = names.empty() || out.asked_auto;
  if (out.chosen) {
    const int gpus = acc.gpus;
    const std::string& why = acc.no_gpu_reason;
    for (int s = 0; s < stages; ++s)
      out.per_stage.push_back(gpus == 0 ? c10::Device(c10::kCPU)
                                        : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(
                                                                      (local_rank >= 0 ? local_rank : s) % gpus)));
    const std::string of_gpus = detail::concat(" of ", gpus, " GPU", gpus == 1 ? "" : "s");
    out.note = gpus == 0 ? detail::concat("pipeline.devices auto: the CPU (", why.empty() ? "no CUDA device" : why, ")")
               : local_rank >= 0
                   ? detail::concat("pipeline.devices auto: this rank's stages on cuda:", local_rank % gpus, of_gpus,
                                    " (its place among its host's ranks)")
                   : detail::concat("pipeline.devices auto: ", stages, " stage", stages == 1 ? "" : "s", " on ",
                                    std::min(stages, gpus), of_gpus);
    return out;
  }
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == "auto")
      throw ConfigError(detail::concat(where, "[", i, "]: \"auto\" stands alone (\"devices\": \"auto\"), not in a list"));
  if (names.size() != 1 && static_cast<int>(names.size()) != stages)
    throw ConfigError(detail::concat(where, ": ", names.size(), " devices for ", stages, " stage", stages == 1 ? "" : "s",
                                     "; give one device for every stage, or one for all"));
  for (int s = 0; s < stages; ++s) {
    const size_t i = names.size() == 1 ? 0 : static_cast<size_t>(s);
    out.per_stage.push_back(parse_device_on(names[i], names.size() == 1 ? where : detail::concat(where, "[", i, "]"), acc));
  }
  return out;
}

}  // namespace pipetrain::stages
