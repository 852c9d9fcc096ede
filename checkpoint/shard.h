// The file format of a checkpoint shard: a dict of named tensors in the format of torch.save,
// which Python's torch.load reads with its default weights_only loader.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/Dict.h>

namespace pipetrain::checkpoint {

std::vector<char> save_tensor_dict(const c10::Dict<std::string, at::Tensor>& dict);

// The named tensors of a shard's bytes read from `path` (for messages), in the file's order;
// throws CheckpointError when the bytes are not such a dict.
std::vector<std::pair<std::string, at::Tensor>> load_tensor_dict(const std::vector<char>& bytes,
                                                                 const std::string& path);

}  // namespace pipetrain::checkpoint
