#include "schedule/kinds.h"

#include <algorithm>
#include <ostream>

#include "common/error.h"
#include "common/strings.h"
#include "schedule/auto.h"
#include "schedule/schedule.h"

namespace pipetrain::schedule {

namespace {

// "8" or "4 or 8": the multiples of k nearest to m.
std::string nearest_multiples(int k, int m) {
  const int below = (m / k) * k, above = below + k;
  return below >= k ? detail::concat(below, " or ", above) : std::to_string(above);
}

// The kinds whose chunk count may vary, for the hint when one that runs one chunk is given more.
std::string kinds_with_chunks() {
  std::vector<std::string> names;
  for (const KindInfo& k : kind_table())
    if (k.min_chunks < k.max_chunks) names.push_back(k.name);
  return join(names, " or ");
}

}  // namespace

const std::vector<KindInfo>& kind_table() {
  // clang-format off
  static const std::vector<KindInfo> table = {
    {Kind::GPipe, "gpipe", Placement::Loop, 1, 1, 1, false, 0, false, false,
     [](int k, int m, int) { return make_gpipe(k, m); }},
    {Kind::OneFOneB, "1f1b", Placement::Loop, 1, 1, 1, false, 0, false, false,
     [](int k, int m, int) { return make_1f1b(k, m); }},
    {Kind::Interleaved1F1B, "interleaved-1f1b", Placement::Loop, 2, 2, 64, false, 0, true, false,
     [](int k, int m, int v) { return make_interleaved_1f1b(k, m, v); }},
    {Kind::ZbH1, "zb-h1", Placement::Loop, 1, 1, 1, true, 0, false, false,
     [](int k, int m, int) { return make_zb_h1(k, m); }},
    {Kind::ZbH2, "zb-h2", Placement::Loop, 1, 1, 1, true, 0, false, false,
     [](int k, int m, int) { return make_zb_h2(k, m); }},
    {Kind::LoopedBfs, "looped-bfs", Placement::Loop, 2, 2, 64, false, 0, false, false,
     [](int k, int m, int v) { return make_looped_bfs(k, m, v); }},
    {Kind::ZbV, "zb-v", Placement::V, 2, 2, 2, true, 0, false, false,
     [](int k, int m, int) { return make_zb_v(k, m); }},
    {Kind::DualPipeV, "dualpipev", Placement::V, 2, 2, 2, true, 2, false, false,
     [](int k, int m, int) { return make_dualpipev(k, m); }},
    {Kind::ZbAuto, "zb-auto", Placement::Loop, 1, 1, 1, true, 0, false, true,
     [](int k, int m, int) { return make_zb_auto(k, m, Costs::uniform(k, 1, 1, 1), 2.0 * std::min(k, m)); }},
  };
  // clang-format on
  return table;
}

const KindInfo& info(Kind kind) {
  const auto& table = kind_table();
  const auto i = static_cast<size_t>(kind);
  if (i >= table.size() || table[i].kind != kind)
    throw ScheduleError(detail::concat("schedule: no row for kind ", static_cast<int>(kind)));
  return table[i];
}

const char* name(Kind kind) { return info(kind).name; }

std::optional<Kind> find_kind(const std::string& name) {
  for (const KindInfo& k : kind_table())
    if (name == k.name) return k.kind;
  return std::nullopt;
}

Kind parse_kind(const std::string& name) {
  if (auto k = find_kind(name)) return *k;
  throw ScheduleError("schedule: unknown kind '" + name + "' (known: " + join(kind_names(), ", ") + ")");
}

std::vector<Kind> all_kinds() {
  std::vector<Kind> kinds;
  for (const KindInfo& k : kind_table()) kinds.push_back(k.kind);
  return kinds;
}

std::ostream& operator<<(std::ostream& os, Kind kind) { return os << name(kind); }

std::vector<std::string> kind_names() {
  std::vector<std::string> names;
  for (const KindInfo& k : kind_table()) names.emplace_back(k.name);
  return names;
}

int chunks_for(Kind kind, int wanted) {
  const KindInfo& k = info(kind);
  return wanted >= k.min_chunks && wanted <= k.max_chunks ? wanted : k.default_chunks;
}

void check_supported(Kind kind, int stages, int micro_batches, int chunks) {
  const KindInfo& k = info(kind);
  if (stages < 1) throw ScheduleError(detail::concat("schedule: stages must be >= 1, got ", stages));
  if (micro_batches < 1)
    throw ScheduleError(detail::concat("schedule: micro_batches must be >= 1, got ", micro_batches));
  if (chunks < 1) throw ScheduleError(detail::concat("schedule: chunks must be >= 1, got ", chunks));
  if (k.max_chunks == 1 && chunks != 1)
    throw ScheduleError(detail::concat("schedule: ", k.name, " runs one chunk per stage, got chunks = ", chunks,
                                       " (use ", kinds_with_chunks(), " for virtual stages)"));
  if (k.min_chunks == k.max_chunks && chunks != k.min_chunks)
    throw ScheduleError(detail::concat("schedule: ", k.name, " runs ", k.min_chunks, " chunks per stage",
                                       k.placement == Placement::V ? " in a V" : "", ", got chunks = ", chunks));
  if (chunks < k.min_chunks)
    throw ScheduleError(detail::concat("schedule: ", k.name, " needs chunks >= ", k.min_chunks, ", got ", chunks,
                                       " (use 1f1b or gpipe for one chunk)"));
  if (chunks > k.max_chunks)
    throw ScheduleError(detail::concat("schedule: ", k.name, " runs at most ", k.max_chunks, " chunks per stage, got ",
                                       chunks));
  if (micro_batches < k.min_micro_batches_per_stage * stages)  // 0 for the kinds with no minimum
    throw ScheduleError(detail::concat("schedule: ", k.name, " needs at least ",
                                       k.min_micro_batches_per_stage == 2 ? "twice" : std::to_string(k.min_micro_batches_per_stage) + " times",
                                       " as many micro-batches as stages (", k.min_micro_batches_per_stage * stages,
                                       " for ", stages, " stages), got ", micro_batches));
  if (k.micro_batches_multiple_of_stages && micro_batches % stages != 0)
    throw ScheduleError(detail::concat("schedule: ", k.name, " sends micro-batches in groups of the stage count (",
                                       stages, "), so micro_batches must be a multiple of ", stages, "; got ",
                                       micro_batches, ", try ", nearest_multiples(stages, micro_batches)));
}

}  // namespace pipetrain::schedule
