// kinds: the one table of schedule kinds. Every question about a kind (its name, how it places
// virtual stages on devices, how many chunks it runs, whether it splits the backward, the sizes
// it serves, how it is built) is answered by its row here; no caller compares kind names.
// A kind is parsed from its name once, where a config or a flag is read.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace pipetrain::schedule {

struct Schedule;

/// The schedule kinds, in the order the table (and every listing) shows them.
enum class Kind {
  GPipe,            ///< gpipe: fill-drain
  OneFOneB,         ///< 1f1b: PipeDream-flush
  Interleaved1F1B,  ///< interleaved-1f1b: Megatron-LM's, v chunks per device in a loop
  ZbH1,             ///< zb-h1: zero bubble at 1F1B's memory
  ZbH2,             ///< zb-h2: zero bubble at about twice 1F1B's memory
  LoopedBfs,        ///< looped-bfs: breadth first over v chunks in a loop
  ZbV,              ///< zb-v: zero bubble in a V, two chunks per device
  DualPipeV,        ///< dualpipev: DeepSeek's DualPipe cut in half, in a V
  ZbAuto,           ///< zb-auto: searched for the costs (equal costs when none are given)
};

/// How virtual stages sit on devices: in a loop (device r holds r, r+K, ...) or a V (device r
/// holds r and 2K-1-r).
enum class Placement { Loop, V };

/// One row of the table.
struct KindInfo {
  Kind kind;                  ///< the row's kind
  const char* name;           ///< as configs, flags and traces spell it
  Placement placement;        ///< how its virtual stages sit on devices
  int default_chunks;         ///< chunks per device when none are asked for
  int min_chunks, max_chunks;  ///< the chunk counts it runs
  bool splits_backward;       ///< runs backward_input (B) and backward_weight (W) apart
  /// At least this many micro-batches per device (dualpipev: 2, so M >= 2K); 0 for the others.
  int min_micro_batches_per_stage;
  bool micro_batches_multiple_of_stages;  ///< micro-batches go in groups of the stage count
  /// Built by a search on a cost table (make_zb_auto): callers with costs search on theirs; build
  /// searches equal costs.
  bool searched;
  /// Builds the action lists (sizes already checked); zb-auto on equal costs.
  Schedule (*build)(int stages, int micro_batches, int chunks);
};

/// Every kind, in Kind's order.
const std::vector<KindInfo>& kind_table();
/// The row of `kind`.
const KindInfo& info(Kind kind);
/// The kind's name ("1f1b").
const char* name(Kind kind);
/// The kind named `name`, if there is one.
std::optional<Kind> find_kind(const std::string& name);
/// The kind named `name`; throws ScheduleError listing the known names otherwise.
Kind parse_kind(const std::string& name);
/// Every kind, in the table's order.
std::vector<Kind> all_kinds();
/// Writes the kind's name.
std::ostream& operator<<(std::ostream& os, Kind kind);
/// Every kind's name, in the table's order (for flag checks and listings).
std::vector<std::string> kind_names();

/// Whether the kind runs several chunks per device.
inline bool uses_chunks(Kind kind) { return info(kind).max_chunks > 1; }
/// Whether the kind splits backward into backward_input (B) and backward_weight (W).
inline bool splits_backward(Kind kind) { return info(kind).splits_backward; }
/// How the kind places virtual stages on devices.
inline Placement placement_of(Kind kind) { return info(kind).placement; }
/// The chunks a caller runs when it asks for `wanted` (0: none asked for): the kind's default
/// when it runs one count only or nothing was asked, else `wanted` (checked by check_supported).
int chunks_for(Kind kind, int wanted = 0);

/// Throws ScheduleError naming what would work when the kind cannot serve these sizes (e.g.
/// interleaved-1f1b needs chunks >= 2 and a micro-batch count that is a multiple of the stages).
void check_supported(Kind kind, int stages, int micro_batches, int chunks);

}  // namespace pipetrain::schedule
