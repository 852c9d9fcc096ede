#include "partitioner/cost.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace pipetrain::partitioner {

double stage_time(const std::vector<LayerCost>& costs, int begin, int end, const Device& device) {
  PIPETRAIN_CHECK(0 <= begin && begin < end && end <= static_cast<int>(costs.size()), "stage [", begin, ", ",
                  end, ") of ", costs.size(), " layers");
  double at_begin = 0, sum = 0;
  for (int i = 0; i < end; ++i) {
    if (i == begin) at_begin = sum;
    sum += layer_ms(costs[i]);
  }
  return (sum - at_begin) / device.speed;
}

int64_t memory_bytes(int64_t params, int64_t saved, int64_t input, int in_flight, const MemoryModel& model,
                     int64_t trained) {
  const auto state = static_cast<int64_t>(std::ceil(static_cast<double>(trained < 0 ? params : trained) * model.state_factor));
  int64_t activations = 0;
  switch (model.recompute) {
    case Recompute::Never:
      activations = in_flight * saved;
      break;
    case Recompute::Always:
      activations = in_flight * input + saved;
      break;
    case Recompute::ExceptLast:
      activations = (in_flight - 1) * input + saved;
      break;
  }
  return params + state + activations;
}

int64_t stage_memory(const std::vector<LayerCost>& costs, int begin, int end, int stage,
                     const MemoryModel& model) {
  PIPETRAIN_CHECK(0 <= begin && begin < end && end <= static_cast<int>(costs.size()), "stage [", begin, ", ",
                  end, ") of ", costs.size(), " layers");
  PIPETRAIN_CHECK(stage >= 0 && (model.in_flight.empty() || stage < static_cast<int>(model.in_flight.size())),
                  "stage ", stage, " of ", model.in_flight.size(), " in_flight entries");
  int64_t params = 0, trained = 0, saved = 0, workspace = 0;
  for (int i = begin; i < end; ++i) {
    params += costs[i].param_bytes;
    trained += costs[i].trained_bytes();
    saved += costs[i].saved_bytes;
    workspace = std::max(workspace, costs[i].workspace_bytes);
  }
  const int64_t input = begin == 0 ? model.input_bytes : costs[begin - 1].activation_bytes;
  const int f = model.in_flight.empty() ? 1 : model.in_flight[stage];
  return memory_bytes(params, saved, input, f, model, trained) + workspace;
}

}  // namespace pipetrain::partitioner
