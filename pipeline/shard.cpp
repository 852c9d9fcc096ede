// Checkpoint shards (pipeline/shard.h).
#include "pipeline/shard.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "common/strings.h"
#include "pipeline/manifest.h"

namespace pipetrain::pipeline {

// torch::pickle_save tags the dict's types with a global (torch.jit._pickle.restore_type_tag)
// that torch.load's weights_only loader refuses, so the pickle is written untagged and packed
// into the archive as pickle_save does.
std::vector<char> save_tensor_dict(const c10::Dict<std::string, at::Tensor>& d) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* buf, size_t n) { pickled.insert(pickled.end(), buf, buf + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(d));
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

std::vector<std::pair<std::string, at::Tensor>> load_tensor_dict(const std::vector<char>& bytes,
                                                                 const std::string& path) {
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw CheckpointError("checkpoint shard " + path + ": cannot be read (" +
                          printable(e.what_without_backtrace(), 200) + ")");
  }
  if (!v.isGenericDict()) throw CheckpointError("checkpoint shard " + path + ": not a dict of named tensors");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : v.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor())
      throw CheckpointError("checkpoint shard " + path + ": holds an entry that is not a named tensor");
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

}  // namespace pipetrain::pipeline
