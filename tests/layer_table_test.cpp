// The layer table (models/layer_table.h) is what the list builder reads: its types, its argument
// names and kinds (unknown or mistyped arguments are one line naming the layer, its type and the
// argument), its new rows (sequential, upsample), and the table of docs/models.md, written from it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <torch/torch.h>

#include "common/error.h"
#include "models/layer_table.h"
#include "models/model.h"
#include "models/skip.h"
#include "tests/layer_list_helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

json list(json layers, json input = {4}) { return {{"family", "layers"}, {"input_shape", input}, {"layers", layers}}; }
json linear(const std::string& name, int64_t in, int64_t out) {
  return {{"name", name}, {"type", "linear"}, {"in_features", in}, {"out_features", out}};
}

models::Model build(const json& cfg) { return test::build_model_section(cfg); }
using test::build_error;

TEST(LayerTable, UnknownArgumentsNameTheLayerTheTypeAndTheArgument) {
  json typo = linear("b", 4, 2);
  typo["bais"] = false;
  EXPECT_EQ(build_error(list({linear("a", 4, 4), typo})),
            "test.json: model.layers[1].bais: is not an argument of linear (it takes in_features, out_features, bias; every "
            "layer: name, type, stash, module)");
  EXPECT_EQ(build_error(list({{{"name", "r"}, {"type", "relu"}, {"inplace", true}}})),
            "test.json: model.layers[0].inplace: is not an argument of relu (it takes none; every layer: name, type, stash, module)");
  json mistyped = linear("a", 4, 2);
  mistyped["bias"] = "yes";
  EXPECT_EQ(build_error(list(json::array({mistyped}))),
            "test.json: model.layers[0].bias: expected true or false (an argument of linear), got string \"yes\"");
  json inner = {{"name", "blk"}, {"type", "sequential"}, {"layers", {{{"type", "dropout"}, {"p", "half"}}}}};
  EXPECT_EQ(build_error(list(json::array({inner}))),
            "test.json: model.layers[0].layers[0].p: expected a number (an argument of dropout), got string \"half\"");
}

TEST(LayerTable, AnUnknownTypeListsTheKnownOnes) {
  const std::string e = build_error(list({{{"name", "c"}, {"type", "conv3d"}}}));
  EXPECT_NE(e.find("model.layers[0].type"), std::string::npos) << e;
  for (const std::string& t : models::layer_type_names()) EXPECT_NE(e.find(t), std::string::npos) << t << " not in: " << e;
}

TEST(LayerTable, EveryRowHasHelpAShapeRuleAndKnownArguments) {
  ASSERT_GE(models::layer_table().size(), 36u);
  for (const models::LayerType& t : models::layer_table()) {
    EXPECT_FALSE(t.help.empty()) << t.name;
    EXPECT_FALSE(t.shape.empty()) << t.name;
    EXPECT_EQ(models::find_layer_type(t.name), &t);
  }
  EXPECT_EQ(models::find_layer_type("conv3d"), nullptr);
}

// docs/models.md's layer table is the code's, row for row.
TEST(LayerTable, TheManualsTableIsTheCodes) {
  std::ifstream in(std::string(PIPETRAIN_SOURCE_DIR) + "/docs/models.md");
  std::stringstream s;
  s << in.rdbuf();
  const std::string table = models::layer_table_markdown();
  EXPECT_NE(s.str().find(table), std::string::npos)
      << "docs/models.md's layer table differs from the code's (models::layer_table_markdown), which is:\n" << table;
}

TEST(LayerTable, ASequentialIsOneLayerItsModulesNamedByTheirModule) {
  const json blk = {{"name", "blk"},
                    {"type", "sequential"},
                    {"layers", {{{"type", "linear"}, {"in_features", 4}, {"out_features", 6}}, {{"type", "relu"}},
                                {{"type", "linear"}, {"in_features", 6}, {"out_features", 3}, {"module", "out"}}}}};
  const models::Model m = build(list(json::array({blk})));
  EXPECT_EQ(models::layer_names(m.layers), (std::vector<std::string>{"blk"}));
  EXPECT_EQ(m.layers->named_parameters().keys(),
            (std::vector<std::string>{"blk.linear.weight", "blk.linear.bias", "blk.out.weight", "blk.out.bias"}));
  const auto p = m.layers->named_parameters();
  const at::Tensor x = torch::randn({2, 4});
  const at::Tensor want = torch::linear(torch::relu(torch::linear(x, p["blk.linear.weight"], p["blk.linear.bias"])), p["blk.out.weight"],
                                        p["blk.out.bias"]);
  EXPECT_TRUE(torch::allclose(models::forward_with_skips(m.layers, x), want));
  EXPECT_EQ(m.classes, 3);

  json twice = blk;
  twice["layers"][2].erase("module");
  EXPECT_EQ(build_error(list(json::array({twice}))),
            "test.json: model.layers[0].layers[2].module: 'linear' names another operation of this sequential already; give each "
            "its own \"module\"");
  json own = linear("a", 4, 2);
  own["module"] = "";
  EXPECT_EQ(build(list(json::array({own}))).layers->named_parameters().keys(), (std::vector<std::string>{"a.weight", "a.bias"}));
  json inside = blk;
  inside["layers"][0]["module"] = "";
  EXPECT_NE(build_error(list(json::array({inside}))).find("model.layers[0].layers[0].module: \"\" (the layer's own names) is for a layer of one"),
            std::string::npos);
  EXPECT_EQ(build_error(list({{{"name", "r"}, {"type", "relu"}, {"module", "act"}}})),
            "test.json: model.layers[0].module: relu has no parameters to name");
}

TEST(LayerTable, ASkipMergesInsideASequential) {
  const json layers = {{{"name", "a"}, {"type", "linear"}, {"in_features", 4}, {"out_features", 4}, {"stash", "s"}},
                       {{"name", "b"},
                        {"type", "sequential"},
                        {"layers", {{{"type", "relu"}}, {{"type", "concat"}, {"from", "s"}, {"dim", 1}},
                                    {{"type", "linear"}, {"in_features", 8}, {"out_features", 2}}}}}};
  const models::Model m = build(list(layers));
  const auto skips = models::skips_of(m.layers);
  ASSERT_EQ(skips.size(), 1u);
  EXPECT_EQ(skips[0].stash_layer, 0);
  EXPECT_EQ(skips[0].pop_layer, 1);
  const auto p = m.layers->named_parameters();
  const at::Tensor x = torch::randn({3, 4});
  const at::Tensor h = torch::linear(x, p["a.linear.weight"], p["a.linear.bias"]);
  const at::Tensor want = torch::linear(torch::cat({torch::relu(h), h}, 1), p["b.linear.weight"], p["b.linear.bias"]);
  EXPECT_TRUE(torch::allclose(models::forward_with_skips(m.layers, x), want));
}

TEST(LayerTable, UpsampleDoublesTheSidesOfAnImage) {
  const json up = {{"name", "u"}, {"type", "upsample"}};
  const json flat = {{"name", "f"}, {"type", "flatten"}};
  const models::Model m = build(list({up, flat}, {2, 3, 5}));
  EXPECT_EQ(m.classes, 2 * 6 * 10);
  const at::Tensor x = torch::randn({1, 2, 3, 5});
  EXPECT_TRUE(torch::equal(models::forward_with_skips(m.layers, x).view({1, 2, 6, 10}), x.repeat_interleave(2, 2).repeat_interleave(2, 3)));
  EXPECT_EQ(build_error(list(json::array({up}), {4, 4})),
            "test.json: model.layers[0] (u): expects [channels, height, width] (3 dimensions per sample), gets [4, 4]");
}

}  // namespace

// `scale` multiplies or divides by a number as Python's `x * 0.3` does (the number not rounded to
// the tensor's type first): in bfloat16 that differs from multiplying by 0.3 as a bfloat16 value.
TEST(LayerTable, ScaleTakesItsNumberAsPythonDoes) {
  const models::Model mul = build(list({{{"name", "s"}, {"type", "scale"}, {"by", 0.3}}}));
  const models::Model div = build(list({{{"name", "s"}, {"type", "scale"}, {"by", 3.0}, {"op", "divide"}}}));
  const at::Tensor x = torch::linspace(-4, 4, 4000).reshape({-1, 4}).to(torch::kBFloat16);
  const at::Tensor y = models::forward_with_skips(mul.layers, x);
  EXPECT_TRUE(torch::equal(y, x * 0.3));
  EXPECT_FALSE(torch::equal(y, x * torch::tensor(0.3).to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(models::forward_with_skips(div.layers, x), x / 3.0));
  const at::Tensor x64 = x.to(torch::kDouble) + 1e-3;  // a division, not a product by its inverse
  EXPECT_TRUE(torch::equal(models::forward_with_skips(div.layers, x64), x64 / 3.0));
  EXPECT_FALSE(torch::equal(models::forward_with_skips(div.layers, x64), x64 * (1.0 / 3.0)));
  EXPECT_NE(build_error(list({{{"name", "s"}, {"type", "scale"}}})).find("model.layers[0].by: is required"), std::string::npos);
  EXPECT_NE(build_error(list({{{"name", "s"}, {"type", "scale"}, {"by", 0}, {"op", "divide"}}})).find("must not be 0 with op divide"),
            std::string::npos);
}
