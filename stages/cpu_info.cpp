// The CPU's side of the accelerator report (stages/accelerator.h): its bf16 instructions.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "stages/accelerator.h"

namespace pipetrain::stages {

namespace {
// The value of the first line whose key (before the colon, trimmed) is `key`; "" if none.
std::string field(const std::string& text, const std::string& key, bool* found) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    if (k != key) continue;
    if (found) *found = true;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

bool has_flag(const std::string& flags, const std::string& flag) {
  std::istringstream in(flags);
  std::string f;
  while (in >> f)
    if (f == flag) return true;
  return false;
}
}  // namespace

CpuInfo cpu_info_from(const std::string& cpuinfo) {
  CpuInfo c;
  c.model = field(cpuinfo, "model name", nullptr);
  const std::string flags = field(cpuinfo, "flags", &c.flags_known);
  c.avx512_bf16 = has_flag(flags, "avx512_bf16");
  c.amx_bf16 = has_flag(flags, "amx_bf16");
  return c;
}

CpuInfo cpu_info() {
  std::ifstream f("/proc/cpuinfo");
  std::stringstream text;
  text << f.rdbuf();
  CpuInfo c = cpu_info_from(text.str());
  if (const char* flags = std::getenv("PIPETRAIN_CPU_FLAGS")) {
    const CpuInfo forced = cpu_info_from(std::string("flags : ") + flags);
    c.flags_known = true;
    c.avx512_bf16 = forced.avx512_bf16;
    c.amx_bf16 = forced.amx_bf16;
  }
  return c;
}

std::string slow_bf16_warning(const CpuInfo& cpu, double measured) {
  if (!cpu.flags_known || cpu.fast_bf16()) return "";
  std::string cost = "expect it slower than float32";
  if (measured > 0) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2fx", measured);
    cost = detail::concat("a matrix product measured here ran ", ratio, " the float32 speed");
  }
  return detail::concat("precision bf16 on a CPU stage, but this CPU", cpu.model.empty() ? "" : " (" + cpu.model + ")",
                        " has neither AVX-512 BF16 nor AMX: ", cost, " (train.precision fp32 avoids it)");
}

}  // namespace pipetrain::stages
