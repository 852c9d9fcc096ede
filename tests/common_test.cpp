#include <gtest/gtest.h>

#include "common/error.h"
#include "common/json_reader.h"
#include "common/log.h"
#include "common/option.h"
#include "common/rng.h"
#include "common/strings.h"

using namespace pipetrain;
using nlohmann::json;

TEST(Strings, NearestSuggestsTyposOnly) {
  EXPECT_EQ(nearest("stagse", {"stages", "micro_batches", "schedule"}), "stages");
  EXPECT_EQ(nearest("zzzzzzzz", {"stages", "schedule"}), "");
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(JsonReader, ReadsTypedValuesWithDefaults) {
  JsonReader r(json{{"a", 3}, {"b", 2.5}, {"c", "x"}, {"d", true}}, "sec", "f.json");
  EXPECT_EQ(r.get_int("a", 0, 0, 10), 3);
  EXPECT_EQ(r.get_int("missing", 7, 0, 10), 7);
  EXPECT_DOUBLE_EQ(r.get_number("b", 0, 0, 10), 2.5);
  EXPECT_EQ(r.get_choice("c", "y", {"x", "y"}), "x");
  EXPECT_TRUE(r.get_bool("d", false));
  EXPECT_NO_THROW(r.finish());
}

TEST(JsonReader, ErrorsNameFileAndPath) {
  JsonReader r(json{{"stages", "4"}}, "pipeline", "cfg.json");
  try {
    r.get_int("stages", 1, 1, 8);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "cfg.json: pipeline.stages: expected an integer, got string \"4\"");
  }
}

TEST(JsonReader, UnknownKeyGetsNearestValidKey) {
  JsonReader r(json{{"stagse", 4}}, "pipeline", "cfg.json");
  r.get_int("stages", 1, 1, 8);
  try {
    r.finish();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: pipeline.stagse: unknown key (did you mean 'pipeline.stages'?)"),
              std::string::npos)
        << e.what();
  }
}

TEST(JsonReader, RangeAndChoiceErrors) {
  JsonReader r(json{{"n", 0}, {"k", "gpipf"}}, "p", "c.json");
  EXPECT_THROW(r.get_int("n", 1, 1, 8), ConfigError);
  try {
    r.get_choice("k", "gpipe", {"gpipe"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean \"gpipe\""), std::string::npos) << e.what();
  }
}

TEST(JsonReader, OverrideOriginIsNamed) {
  auto origins = std::make_shared<Origins>();
  (*origins)["p.n"] = "--set p.n=abc";
  JsonReader r(json{{"n", "abc"}}, "p", "c.json", origins);
  try {
    r.get_int("n", 1, 1, 8);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--set p.n=abc: p.n:", 0), 0u) << e.what();
  }
}

TEST(JsonParse, SyntaxErrorHasLineAndColumn) {
  try {
    parse_json("{\n  \"a\": 1,\n  \"b\": ]\n}", "bad.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("bad.json:3:", 0), 0u) << e.what();
  }
}

// Found by fuzz/config_fuzz: a number beyond double's range made nlohmann throw out_of_range,
// which escaped as an unnamed library exception; it is a ConfigError naming the file.
TEST(JsonParse, NumberOverflowIsAConfigError) {
  for (const char* text : {"{\"a\": 2E323}", "[8e940]", "5E555"}) {
    try {
      parse_json(text, "big.json");
      ADD_FAILURE() << text << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("big.json: invalid JSON: number overflow parsing", 0), 0u) << e.what();
    }
  }
}

TEST(Rng, KeysDifferPerField) {
  const uint64_t k = rng_key(1, 2, 3, 4);
  EXPECT_EQ(k, rng_key(1, 2, 3, 4));
  EXPECT_NE(k, rng_key(0, 2, 3, 4));
  EXPECT_NE(k, rng_key(1, 0, 3, 4));
  EXPECT_NE(k, rng_key(1, 2, 0, 4));
  EXPECT_NE(k, rng_key(1, 2, 3, 0));
}

TEST(Rng, GuardRestoresContext) {
  current_rng_context() = RngContext{1, 2, 3};
  {
    RngContextGuard g(RngContext{9, 9, 9});
    EXPECT_EQ(current_rng_context().seed, 9u);
  }
  EXPECT_EQ(current_rng_context().seed, 1u);
  EXPECT_EQ(current_rng_context().sample_offset, 3);
}

// Run options named by id (common/option.h): a marker per option, spelled by the caller; a
// marker of no known option and text around markers stay as they are.
TEST(Options, MarkersAreSpelledByTheCaller) {
  using pipetrain::Option;
  const std::string text = pipetrain::option(Option::Resume) + ": runs/a holds no checkpoint (" +
                           pipetrain::option(Option::CheckpointDir) + " or train.checkpoint_dir) <option:nothing> <b>";
  EXPECT_EQ(text.find("--"), std::string::npos) << text;
  EXPECT_EQ(pipetrain::render_options(text, [](Option o) { return std::string(pipetrain::option_name(o)); }),
            "resume: runs/a holds no checkpoint (checkpoint_dir or train.checkpoint_dir) <option:nothing> <b>");
  EXPECT_EQ(pipetrain::render_options(pipetrain::option(Option::Override) + " a=1: " + pipetrain::option(Option::Trace),
                                      [](Option o) { return o == Option::Override ? std::string("--set") : std::string("?"); }),
            "--set a=1: ?");
}

TEST(Log, LevelsParseAndFilter) {
  EXPECT_EQ(log::parse_level("debug", "x"), log::Level::Debug);
  EXPECT_EQ(log::parse_level("warn", "x"), log::Level::Warning);
  EXPECT_EQ(log::parse_level("off", "x"), log::Level::Off);
  try {
    log::parse_level("loud", "--log-level");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "--log-level: unknown log level 'loud' (debug, info, warning, error, off)");
  }
  const log::Level before = log::level();
  log::set_level(log::Level::Warning);
  EXPECT_FALSE(log::enabled(log::Level::Info));
  EXPECT_FALSE(log::enabled(log::Level::Debug));
  EXPECT_TRUE(log::enabled(log::Level::Warning));
  EXPECT_TRUE(log::enabled(log::Level::Error));
  log::set_level(log::Level::Off);
  EXPECT_FALSE(log::enabled(log::Level::Error));
  EXPECT_FALSE(log::enabled(log::Level::Off));
  log::set_level(before);
}

TEST(Log, ThePrefixNamesTheRankOfARunOfSeveral) {
  ::unsetenv("PIPETRAIN_LOG_RANK");
  log::set_rank(2, 4);
  EXPECT_EQ(log::prefix(), "pipetrain[rank 2]");
  log::set_rank(0, 1);  // a single process: no rank
  EXPECT_EQ(log::prefix(), "pipetrain");
  ::setenv("PIPETRAIN_LOG_RANK", "0", 1);  // under pipetrain launch, which prefixes lines itself
  log::set_rank(2, 4);
  EXPECT_EQ(log::prefix(), "pipetrain");
  ::unsetenv("PIPETRAIN_LOG_RANK");
  log::set_name("pipetrain launch");
  EXPECT_EQ(log::prefix(), "pipetrain launch");
  log::set_name("pipetrain");
}
