// data.kind "tensors": inputs and targets written by Python. `data.path` is either a file saved
// by torch.save holding a dict of tensors ("inputs", "targets", and optionally "test_inputs",
// "test_targets"), read through libtorch's own unpickler, or a folder of .npy files of those
// names (numpy.save), memory-mapped so that a data set larger than memory streams through the
// page cache. Without test tensors the last data.test_fraction of the samples is the test split.
// Inputs: floating point (or integers, widened to float per batch; token ids for a model that
// takes tokens); targets: integer class ids, [N] or [N, T]. Every problem is a DataError naming
// the file and the key.
#pragma once

#include "job/data.h"

namespace pipetrain::job {

Dataset load_tensors(const Config& c, const models::Model& model);

/// One input sample's shape in data.path (its inputs without their first dimension): from the
/// header of inputs.npy alone in a folder, from the tensor in a torch.save file (which is read
/// for it). The same DataErrors as load_tensors for a missing or unreadable inputs.
std::vector<int64_t> tensors_sample_shape(const Config& c);

}  // namespace pipetrain::job
