#include "schedule/trace.h"

#include <nlohmann/json.hpp>

#include "schedule/simulate.h"

namespace pipetrain::schedule {

namespace {

// Events are built as JSON values and written one per line: nlohmann escapes every string
// (control characters included) and writes a NaN or an infinity as null, so the file always parses.
void emit(std::ostream& out, bool& first, const nlohmann::json& event) {
  out << (first ? "\n" : ",\n") << event.dump();
  first = false;
}

void write_event(std::ostream& out, bool& first, const TraceSpan& s, int pid, int tid) {
  std::string name = s.name;
  if (s.micro_batch >= 0) name += " " + std::to_string(s.micro_batch);
  if (s.chunk > 0) name += "." + std::to_string(s.chunk);
  nlohmann::json args{{"step", s.step}};
  if (s.micro_batch >= 0) args["micro_batch"] = s.micro_batch, args["chunk"] = s.chunk;
  // Microseconds, the unit of the format.
  emit(out, first,
       {{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"name", name}, {"cat", s.name}, {"ts", s.start_ms * 1e3},
        {"dur", (s.end_ms - s.start_ms) * 1e3}, {"args", args}});
}

std::string detail_name(const std::string& counter, size_t stage) {
  return (counter.empty() ? std::string("counter") : counter) + " stage " + std::to_string(stage);
}

void write_name(std::ostream& out, bool& first, const char* what, int pid, int tid, const std::string& name) {
  emit(out, first, {{"ph", "M"}, {"pid", pid}, {"tid", tid}, {"name", what}, {"args", {{"name", name}}}});
}
}  // namespace

TraceTimeline simulated_timeline(const Simulation& sim, std::string title) {
  TraceTimeline t{std::move(title), {}, "activation memory", sim.memory};
  for (const auto& stage : sim.spans) {
    t.spans.emplace_back();
    for (const auto& s : stage)
      t.spans.back().push_back(s.finish ? TraceSpan{s.op == Op::BackwardWeight ? "flush" : "optimizer", -1, 0, 0, s.start, s.end}
                                        : TraceSpan{op_name(s.op), s.micro_batch, s.chunk, 0, s.start, s.end});
  }
  return t;
}

void write_chrome_trace(std::ostream& out, const std::vector<TraceTimeline>& timelines, double min_idle_ms) {
  out << R"({"displayTimeUnit":"ms","traceEvents":[)";
  bool first = true;
  for (size_t p = 0; p < timelines.size(); ++p) {
    const TraceTimeline& t = timelines[p];
    const int pid = static_cast<int>(p);
    write_name(out, first, "process_name", pid, 0, t.title);
    for (size_t r = 0; r < t.spans.size(); ++r) {
      const int tid = static_cast<int>(r);
      write_name(out, first, "thread_name", pid, tid, "stage " + std::to_string(r));
      double last_end = -1;
      int64_t last_step = 0;
      bool reduces = false;
      for (const TraceSpan& s : t.spans[r]) {
        if (s.name == "reduce") {  // beside the stage's compute: a row of its own
          const int link = static_cast<int>(t.spans.size() + r);
          if (!reduces) write_name(out, first, "thread_name", pid, link, "stage " + std::to_string(r) + " reduce");
          reduces = true;
          write_event(out, first, s, pid, link);
          continue;
        }
        if (last_end >= 0 && s.step == last_step && s.start_ms - last_end >= min_idle_ms)
          write_event(out, first, TraceSpan{"idle", -1, 0, s.step, last_end, s.start_ms}, pid, tid);
        write_event(out, first, s, pid, tid);
        last_end = s.end_ms;
        last_step = s.step;
      }
      if (r < t.counters.size())
        for (const auto& [ms, value] : t.counters[r]) {
          emit(out, first,
               {{"ph", "C"}, {"pid", pid}, {"tid", tid}, {"name", detail_name(t.counter_name, r)}, {"ts", ms * 1e3},
                {"args", {{"held", value}}}});
        }
    }
  }
  out << "\n]}\n";
}

}  // namespace pipetrain::schedule
