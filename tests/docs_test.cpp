// The manual against the code: every config key the config reader and the model families ask
// for is in docs/config.md (recorded while configs are read, so a new key without a row fails
// here), as is every name of each closed set a key takes, and every subcommand of `pipetrain`
// and every option of each is in docs/cli.md (read from the command's own --help).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"
#include "common/option.h"
#include "models/model.h"
#include "tests/process_helpers.h"
#include "job/config.h"

namespace {

std::string read_doc(const std::string& name) {
  std::ifstream in(std::string(PIPETRAIN_SOURCE_DIR) + "/docs/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> table_rows(const std::string& doc) {
  std::vector<std::string> rows;
  std::istringstream in(doc);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("| `", 0) == 0) rows.push_back(line);
  return rows;
}

std::string first_cell(const std::string& row) {
  const size_t end = row.find(" |", 2);
  return row.substr(0, end);
}

// The keys a model family reads ("model.width"), recorded while it is built with its defaults.
std::set<std::string> family_keys(const std::string& family) {
  std::set<std::string> keys;
  pipetrain::record_keys(&keys);
  nlohmann::json m{{"family", family}};
  pipetrain::JsonReader r(m, "model", "test");
  try {
    pipetrain::models::build(r, 0);
  } catch (const pipetrain::Error&) {  // a key read before a refusal is recorded all the same
  }
  pipetrain::record_keys(nullptr);
  return keys;
}

// Every key path outside the model that configs can hold: read while a few configs (each data
// kind and runtime) are parsed.
std::set<std::string> config_keys() {
  std::set<std::string> keys;
  pipetrain::record_keys(&keys);
  for (
      const char* extra :
      {R"({"data": {"kind": "synthetic"}})",
       R"({"data": {"kind": "text", "path": "/etc/hostname"}, "model": {"family": "gpt", "vocab_size": 256}})",
       R"({"runtime": {"kind": "processes"}, "optimizer": {"kind": "adamw"}})",
       R"({"pipeline": {"balance": "time", "memory_limit": 1000000000}, "optimizer": {"kind": "sgd", "momentum": 0.9}})"}) {
    nlohmann::json c = nlohmann::json::parse(R"({"model": {"family": "mlp"}})");
    c.merge_patch(nlohmann::json::parse(extra));
    try {
      pipetrain::job::parse_config(c, "test");
    } catch (const pipetrain::Error&) {  // a key read before a refusal is recorded all the same
    }
  }
  pipetrain::record_keys(nullptr);
  // Leaves only: a section ("pipeline") is not a key of its own.
  std::set<std::string> leaves;
  for (const auto& k : keys) {
    auto next = keys.upper_bound(k);
    if (next != keys.end() && next->rfind(k + ".", 0) == 0) continue;
    leaves.insert(k);
  }
  return leaves;
}

}  // namespace

// A key "a.b" is documented by a row of docs/config.md whose first cell names it, whole or as
// a later name in a row that starts with its section ("| `optimizer.lr`, `momentum`, ..."); a
// model family's key ("model.width" of mlp) by a row of that family — "(mlp)" in its first
// cell — that names it anywhere.
TEST(Manual, EveryConfigKeyIsInTheConfigReference) {
  const auto rows = table_rows(read_doc("config.md"));
  ASSERT_GT(rows.size(), 20u);
  const std::set<std::string> keys = config_keys();
  ASSERT_GT(keys.size(), 40u) << "the recorder saw too few keys";
  for (const std::string& family : pipetrain::models::families()) {
    const std::set<std::string> recorded = family_keys(family);
    ASSERT_FALSE(recorded.empty()) << "the recorder saw no key of the " << family << " family";
    for (const auto& key : recorded) {
      const std::string name = key.substr(key.find('.') + 1);
      bool found = name == "family";
      for (const auto& row : rows)
        if (first_cell(row).find("(" + family + ")") != std::string::npos &&
            (row.find("`" + name + "`") != std::string::npos ||
             row.find("`model." + name + "`") != std::string::npos))
          found = true;
      EXPECT_TRUE(found) << "model." << name << " of the " << family << " family is not in docs/config.md";
    }
  }
  for (const auto& key : keys) {
    if (key == "model" || key.rfind("model.", 0) == 0) continue;  // checked per family above
    const std::string section = key.substr(0, key.find('.') + 1), name = key.substr(key.find('.') + 1);
    bool found = false;
    for (const auto& row : rows) {
      const std::string cell = first_cell(row);
      if (cell.find("`" + key + "`") != std::string::npos ||
          (cell.find("`" + section) != std::string::npos && cell.find("`" + name + "`") != std::string::npos))
        found = true;
    }
    EXPECT_TRUE(found) << key << " is not in docs/config.md";
  }
}

namespace {
// The row of docs/config.md whose first cell names `key`.
std::string row_of(const std::vector<std::string>& rows, const std::string& key) {
  for (const auto& row : rows)
    if (first_cell(row).find("`" + key + "`") != std::string::npos) return row;
  return "";
}

template <class E>
void expect_documented(const std::vector<std::string>& rows, const std::string& key) {
  const std::string row = row_of(rows, key);
  ASSERT_FALSE(row.empty()) << key << " has no row in docs/config.md";
  for (const std::string& name : pipetrain::job::choice_names<E>(true))
    EXPECT_NE(row.find("`" + name + "`"), std::string::npos) << key << " " << name << " is not in docs/config.md";
}
}  // namespace

// Every name of every closed set's table (job/choices.h, comm/backend.h) is in its key's row of
// docs/config.md.
TEST(Manual, EveryValueOfAClosedSetIsInTheConfigReference) {
  const auto rows = table_rows(read_doc("config.md"));
  expect_documented<pipetrain::job::RuntimeKind>(rows, "runtime.kind");
  expect_documented<pipetrain::job::DataKind>(rows, "data.kind");
  expect_documented<pipetrain::job::BalanceMethod>(rows, "pipeline.balance");
  expect_documented<pipetrain::job::DType>(rows, "runtime.dtype");
  expect_documented<pipetrain::job::LrSchedule>(rows, "optimizer.lr_schedule");
  expect_documented<pipetrain::job::OnNonfinite>(rows, "train.on_nonfinite");
  const std::string transport = row_of(rows, "runtime.transport");
  for (const std::string& name : pipetrain::comm::backend_names())
    EXPECT_NE(transport.find("`" + name + "`"), std::string::npos) << "runtime.transport " << name;
}

// Every subcommand the command lists in its --help, and every option each lists in its own, is
// in docs/cli.md.
TEST(Manual, EverySubcommandAndOptionIsInTheCommandReference) {
  const std::string doc = read_doc("cli.md");
  const auto help = pipetrain::test::shell(std::string(PIPETRAIN_BINARY) + " --help 2>&1");
  ASSERT_EQ(help.status, 0) << help.out;
  // CLI11 heads the list "Subcommands:" (2.x) or "SUBCOMMANDS:" (older releases).
  size_t at = help.out.find("Subcommands:");
  if (at == std::string::npos) at = help.out.find("SUBCOMMANDS:");
  ASSERT_NE(at, std::string::npos) << help.out;
  std::istringstream lines(help.out.substr(at));
  std::string line;
  std::getline(lines, line);
  std::vector<std::string> subcommands;
  const std::regex sub_line(R"(^\s+([a-z][a-z-]*)\s)");
  std::smatch m;
  while (std::getline(lines, line))
    if (std::regex_search(line, m, sub_line)) subcommands.push_back(m[1]);
  ASSERT_GE(subcommands.size(), 10u) << help.out;
  for (const std::string& sub : subcommands) {
    EXPECT_NE(doc.find("pipetrain " + sub), std::string::npos)
        << "pipetrain " << sub << " is not in docs/cli.md";
    const auto sub_help = pipetrain::test::shell(std::string(PIPETRAIN_BINARY) + " " + sub + " --help 2>&1");
    const std::regex option(R"((--[a-z][a-z-]+))");
    for (auto it = std::sregex_iterator(sub_help.out.begin(), sub_help.out.end(), option);
         it != std::sregex_iterator(); ++it) {
      const std::string flag = (*it)[1];
      if (flag == "--help") continue;
      EXPECT_NE(doc.find(flag), std::string::npos)
          << "pipetrain " << sub << " " << flag << " is not in docs/cli.md";
    }
  }
}

// The one table of run-option flags (apps/option_flags.cpp, read as text: tests go through the
// command, not apps/) names only flags the command has, one per option id.
TEST(Manual, EveryRunOptionIsSpelledAsAFlagOfTheCommand) {
  std::set<std::string> flags;
  for (const char* sub : {"train", "eval", "generate", "launch", "export", "bench", "plan", "partition", "simulate", "costs transformer"}) {
    const auto help = pipetrain::test::shell(std::string(PIPETRAIN_BINARY) + " " + sub + " --help 2>&1");
    const std::regex option(R"((--[a-z][a-z-]+))");
    for (auto it = std::sregex_iterator(help.out.begin(), help.out.end(), option); it != std::sregex_iterator(); ++it)
      flags.insert((*it)[1]);
  }
  std::ifstream in(std::string(PIPETRAIN_SOURCE_DIR) + "/apps/option_flags.cpp");
  const std::string table((std::istreambuf_iterator<char>(in)), {});
  const std::regex entry(R"re(case Option::([A-Za-z]+): return "(--[a-z-]+)";)re");
  std::set<std::string> ids;
  for (auto it = std::sregex_iterator(table.begin(), table.end(), entry); it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(ids.insert((*it)[1]).second) << (*it)[1] << " is spelled twice";
    EXPECT_TRUE(flags.count((*it)[2])) << "Option::" << (*it)[1] << " is spelled " << (*it)[2] << ", which no subcommand has";
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(pipetrain::Option::BytesPerValue) + 1) << "an option id without a flag";
}
