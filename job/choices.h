// The closed sets a config names besides the schedule kinds (schedule/kinds.h), recomputation,
// precision and optimizers (common/), and the transport backends (comm/backend.h): each an enum
// with one table row per value (its name, what it is, what it needs). A value is parsed from its
// name once, where the config is read (job/config.cpp); everything after compares enums, and a
// name goes back out (messages, files) through its row. Nothing here includes libtorch.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pipetrain::job {

/// runtime.kind: where the stages run.
enum class RuntimeKind {
  Threads,    ///< threads: one process, a thread per stage
  Processes,  ///< processes: one process (rank) per stage, started by a launcher
};

/// data.kind: where the samples come from.
enum class DataKind {
  Synthetic,     ///< synthetic: random inputs of the model's shape, targets from a fixed teacher
  FashionMnist,  ///< fashion-mnist: the IDX files under data.path
  Text,          ///< text: the bytes of the file data.path, for the gpt family
  Tensors,       ///< tensors: inputs and targets written by Python (job/tensors_data.h)
  Tokens,        ///< tokens: a flat file of token ids (job/tokens_data.h)
};

/// pipeline.balance: how the layers are split into stages.
enum class BalanceMethod {
  Uniform,     ///< uniform: equal layer counts
  Parameters,  ///< parameters: equal parameter bytes
  Time,        ///< time: exact min-max of profiled time under memory limits and speeds
  Memory,      ///< memory: exact min-max of predicted peak memory
  List,        ///< a list of layer counts (pipeline.balance given as one; no name in a config)
};

/// runtime.dtype: the dtype of parameters and activations.
enum class DType {
  Float32,  ///< float32
  Float64,  ///< float64: for equivalence checks at a tight tolerance
};

/// optimizer.lr_schedule: the learning rate after warm-up.
enum class LrSchedule {
  Constant,  ///< constant: optimizer.lr
  Cosine,    ///< cosine: from lr towards min_lr over the steps after warm-up
};

/// train.on_nonfinite: what a NaN or infinite loss or gradient does.
enum class OnNonfinite {
  Stop,  ///< stop: the run ends with an error
  Skip,  ///< skip: the update is skipped and the run goes on
};

/// data.dtype: how a token file stores its ids (little-endian).
enum class TokenDType {
  Uint16,  ///< uint16: the default of a raw .bin, vocabularies up to 65536
  Uint32,  ///< uint32
  Uint8,   ///< uint8
  Int32,   ///< int32
  Int64,   ///< int64
};

/// One value of a closed set: its name as configs spell it, what it is, and what it needs
/// ("" for nothing).
template <class E>
struct Choice {
  E value;           ///< the row's value
  const char* name;  ///< as configs and messages spell it
  const char* help;  ///< what it is, in a few words
  const char* needs;  ///< what it needs from the rest of the config ("" for nothing)
  bool spelled = true;  ///< a config names it by `name` (false: BalanceMethod::List, a list instead)
};

/// The table of the set E, in E's order (job/choices.cpp has one per set).
template <class E>
const std::vector<Choice<E>>& choices();

template <> const std::vector<Choice<RuntimeKind>>& choices<RuntimeKind>();      ///< runtime.kind
template <> const std::vector<Choice<DataKind>>& choices<DataKind>();            ///< data.kind
template <> const std::vector<Choice<BalanceMethod>>& choices<BalanceMethod>();  ///< pipeline.balance
template <> const std::vector<Choice<DType>>& choices<DType>();                  ///< runtime.dtype
template <> const std::vector<Choice<LrSchedule>>& choices<LrSchedule>();        ///< optimizer.lr_schedule
template <> const std::vector<Choice<OnNonfinite>>& choices<OnNonfinite>();      ///< train.on_nonfinite
template <> const std::vector<Choice<TokenDType>>& choices<TokenDType>();        ///< data.dtype

/// The row of `value`.
template <class E>
const Choice<E>& choice(E value) {
  const auto& table = choices<E>();
  const auto i = static_cast<size_t>(value);
  return table.at(i);  // rows are in E's order (tests/config_test.cpp checks every table)
}

/// The name of `value` ("processes").
template <class E>
const char* choice_name(E value) {
  return choice(value).name;
}

/// Every name of the set, in the table's order; `spelled_only` leaves out the values that a
/// config cannot name (BalanceMethod::List, given as a list instead).
template <class E>
std::vector<std::string> choice_names(bool spelled_only = false) {
  std::vector<std::string> names;
  for (const Choice<E>& c : choices<E>())
    if (!spelled_only || c.spelled) names.emplace_back(c.name);
  return names;
}

/// The value named `name`, if a config can name one so.
template <class E>
std::optional<E> find_choice(const std::string& name) {
  for (const Choice<E>& c : choices<E>())
    if (c.spelled && name == c.name) return c.value;
  return std::nullopt;
}

}  // namespace pipetrain::job
