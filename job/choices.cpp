#include "job/choices.h"

namespace pipetrain::job {

// clang-format off
template <>
const std::vector<Choice<RuntimeKind>>& choices<RuntimeKind>() {
  static const std::vector<Choice<RuntimeKind>> table = {
    {RuntimeKind::Threads, "threads", "one process, a thread per stage", ""},
    {RuntimeKind::Processes, "processes", "one process (rank) per stage, started by a launcher",
     "a launcher's ranks (pipetrain launch, torchrun-style variables, mpirun, srun), pipeline.stages x "
     "pipeline.data_parallel of them, and a transport that connects processes"},
  };
  return table;
}

template <>
const std::vector<Choice<DataKind>>& choices<DataKind>() {
  static const std::vector<Choice<DataKind>> table = {
    {DataKind::Synthetic, "synthetic", "random inputs of the model's shape, targets from a fixed teacher",
     "data.samples and data.test_samples: the splits' sizes"},
    {DataKind::FashionMnist, "fashion-mnist", "Fashion-MNIST's images and labels",
     "data.path: the folder of its IDX files (gzipped or not)"},
    {DataKind::Text, "text", "the bytes of a text file, for the gpt family with a vocabulary of 256",
     "data.path: the text file to train on"},
    {DataKind::Tensors, "tensors", "inputs and targets written by Python",
     "data.path: a torch.save file of a dict of tensors, or a folder of .npy files"},
    {DataKind::Tokens, "tokens", "a flat file of token ids, for a model that takes token ids",
     "data.path: a .npy or raw .bin file of token ids"},
  };
  return table;
}

template <>
const std::vector<Choice<BalanceMethod>>& choices<BalanceMethod>() {
  static const std::vector<Choice<BalanceMethod>> table = {
    {BalanceMethod::Uniform, "uniform", "equal layer counts", ""},
    {BalanceMethod::Parameters, "parameters", "equal parameter bytes", ""},
    {BalanceMethod::Time, "time", "exact min-max of profiled forward and backward time", "a profile (run before the split)"},
    {BalanceMethod::Memory, "memory", "exact min-max of predicted peak memory", "a profile (run before the split)"},
    {BalanceMethod::List, "list", "layer counts per virtual stage, given as a list",
     "one count per virtual stage (pipeline.stages x pipeline.chunks), summing to the model's layers", false},
  };
  return table;
}

template <>
const std::vector<Choice<DType>>& choices<DType>() {
  static const std::vector<Choice<DType>> table = {
    {DType::Float32, "float32", "parameters and activations in float32", ""},
    {DType::Float64, "float64", "parameters and activations in float64", "train.precision fp32"},
  };
  return table;
}

template <>
const std::vector<Choice<LrSchedule>>& choices<LrSchedule>() {
  static const std::vector<Choice<LrSchedule>> table = {
    {LrSchedule::Constant, "constant", "optimizer.lr after the warm-up", ""},
    {LrSchedule::Cosine, "cosine", "from optimizer.lr towards optimizer.min_lr, a half cosine over the steps after warm-up",
     ""},
  };
  return table;
}

template <>
const std::vector<Choice<OnNonfinite>>& choices<OnNonfinite>() {
  static const std::vector<Choice<OnNonfinite>> table = {
    {OnNonfinite::Stop, "stop", "the run ends with an error naming the step", ""},
    {OnNonfinite::Skip, "skip", "the update is skipped (no parameter changes) and the run goes on", ""},
  };
  return table;
}

template <>
const std::vector<Choice<TokenDType>>& choices<TokenDType>() {
  static const std::vector<Choice<TokenDType>> table = {
    {TokenDType::Uint16, "uint16", "2-byte unsigned ids, vocabularies up to 65536", ""},
    {TokenDType::Uint32, "uint32", "4-byte unsigned ids", ""},
    {TokenDType::Uint8, "uint8", "1-byte unsigned ids, vocabularies up to 256", ""},
    {TokenDType::Int32, "int32", "4-byte signed ids", ""},
    {TokenDType::Int64, "int64", "8-byte signed ids", ""},
  };
  return table;
}
// clang-format on

}  // namespace pipetrain::job
