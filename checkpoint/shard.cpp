// Checkpoint shards (pipeline/shard.h).
#include "checkpoint/shard.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "common/strings.h"
#include "checkpoint/manifest.h"

namespace pipetrain::checkpoint {

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

namespace {

// libtorch's pickle_load reads the archive through a reader that copies whatever range the zip
// library asks for, past the end of the buffer when a damaged or forged archive points there
// (a heap overflow that fuzz/shard_fuzz found). This reader gives at most what the buffer holds;
// the zip library then reports the archive as broken.
class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    const size_t got = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, got);
    return got;
  }

 private:
  const std::vector<char>& bytes_;
};

// The bytes of a record of the archive. Its size comes from the zip directory, which a forged
// archive can set to anything: no record of a shard is larger than the shard itself.
std::string record_text(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name, size_t archive) {
  if (!reader.hasRecord(name)) throw CheckpointError("no " + name + " in the archive");
  if (reader.getRecordSize(name) > archive)
    throw CheckpointError(name + " claims more bytes than the archive holds");
  auto [data, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

// Checks the opcode stream of a pickle before libtorch's unpickler sees it: every opcode known,
// every length within the bytes, and memo indices dense (a PUT at most one past the entries
// stored, a GET only of a stored one). libtorch grows its memo to whatever index a PUT names, so
// a forged LONG_BINPUT of 4e9 would allocate 64 GB (found by fuzz/shard_fuzz). Returns "" or why not.
std::string check_pickle(const std::string& p) {
  size_t at = 0, memo = 0;
  const auto need = [&](uint64_t n) { return n <= p.size() - at; };
  const auto le = [&](int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[at + i])) << (8 * i);
    at += static_cast<size_t>(bytes);
    return v;
  };
  const auto line = [&] {  // a newline-terminated argument
    const size_t nl = p.find('\n', at);
    if (nl == std::string::npos) return false;
    at = nl + 1;
    return true;
  };
  while (at < p.size()) {
    const auto op = static_cast<unsigned char>(p[at++]);
    switch (op) {
      case '(': case '.': case '0': case '1': case '2': case 'N': case 'Q': case 'R': case 'a': case 'b':
      case 'd': case '}': case 'e': case 'l': case ']': case 'o': case 's': case 't': case ')': case 'u':
      case 0x81: case 0x85: case 0x86: case 0x87: case 0x88: case 0x89: case 0x8f: case 0x90: case 0x91:
      case 0x92: case 0x93:
        if (op == '.') return at == p.size() ? "" : "bytes after STOP";
        break;
      case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g': case 'p':
        if (!line()) return "an unterminated argument";
        if (op == 'g' || op == 'p') return "text memo opcodes";  // never written by libtorch
        break;
      case 'c': case 'i':
        if (!line() || !line()) return "an unterminated global";
        break;
      case 'K': case 0x80: case 0x82: if (!need(1)) return "a truncated opcode"; at += 1; break;
      case 'M': case 0x83: if (!need(2)) return "a truncated opcode"; at += 2; break;
      case 'J': case 0x84: if (!need(4)) return "a truncated opcode"; at += 4; break;
      case 'G': case 0x95: if (!need(8)) return "a truncated opcode"; at += 8; break;
      case 'U': case 'C': case 0x8a: case 0x8c: {  // 1-byte length, then data
        if (!need(1)) return "a truncated length";
        const uint64_t n = le(1);
        if (!need(n)) return "data past the end";
        at += n;
        break;
      }
      case 'T': case 'X': case 'B': case 0x8b: {  // 4-byte length
        if (!need(4)) return "a truncated length";
        const uint64_t n = le(4);
        if (!need(n)) return "data past the end";
        at += n;
        break;
      }
      case 0x8d: case 0x8e: {  // 8-byte length
        if (!need(8)) return "a truncated length";
        const uint64_t n = le(8);
        if (!need(n)) return "data past the end";
        at += n;
        break;
      }
      case 'q': case 'r': case 'h': case 'j': {  // BINPUT, LONG_BINPUT, BINGET, LONG_BINGET
        const int bytes = op == 'q' || op == 'h' ? 1 : 4;
        if (!need(bytes)) return "a truncated memo index";
        const uint64_t id = le(bytes);
        if (op == 'q' || op == 'r') {
          if (id > memo) return "a memo index out of sequence";
          if (id == memo) ++memo;
        } else if (id >= memo) {
          return "a memo index never stored";
        }
        break;
      }
      case 0x94: ++memo; break;  // MEMOIZE
      default: return "unknown opcode " + std::to_string(op);
    }
  }
  return "no STOP";
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> load_tensor_dict(const std::vector<char>& bytes,
                                                                 const std::string& path) {
  c10::IValue v;
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BoundedReader>(bytes));
    const std::string wrong = check_pickle(record_text(reader, "data.pkl", bytes.size()));
    if (!wrong.empty()) throw CheckpointError("malformed pickle (" + wrong + ")");
    v = torch::jit::readArchiveAndTensors("data", "", "", std::nullopt, std::nullopt, std::nullopt, reader);
  } catch (const CheckpointError& e) {
    throw CheckpointError("checkpoint shard " + path + ": cannot be read (" + e.what() + ")");
  } catch (const c10::Error& e) {
    throw CheckpointError("checkpoint shard " + path + ": cannot be read (" +
                          printable(e.what_without_backtrace(), 200) + ")");
  } catch (const std::bad_alloc&) {
    throw CheckpointError("checkpoint shard " + path + ": cannot be read (it asks for more memory than there is)");
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

}  // namespace pipetrain::checkpoint
