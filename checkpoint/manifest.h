// The manifest of a checkpoint (ROOT/step-N/manifest.json): the step, the data position, the
// random-stream step, the stage layout, each shard's size and CRC-32, and the identity of the run
// with its hash; since version 2 a hash over every other field. Everything that drives a resume
// is checked before it is trusted: the hashes, the types, and that the fields agree with each
// other and with the directory's name. No libtorch here.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace pipetrain::checkpoint {

// A checkpoint that is missing, damaged, or written by a different run; says which and why.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

constexpr const char* kManifestFormat = "pipetrain-checkpoint";
// Version 2 adds manifest_hash (over every other field); version 1 manifests are still read.
constexpr int kManifestVersion = 2;
constexpr int kOldestManifestVersion = 1;

// 16 hex digits (FNV-1a 64) of a JSON value's compact text (keys sorted).
std::string identity_hash(const nlohmann::json& identity);

// The step of a directory name "step-<digits>", or -1.
int64_t step_of(const std::string& name);

// Adds the format, the version and the hash over every field to a manifest's fields.
void seal_manifest(nlohmann::json& manifest);

// Parses and checks the text of a manifest read from `file`, held by a directory named
// `dir_name` ("" when unknown); throws CheckpointError saying what is wrong.
nlohmann::json check_manifest(const std::string& text, const std::string& file, const std::string& dir_name);

}  // namespace pipetrain::checkpoint
