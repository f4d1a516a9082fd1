// core/cpu.h: the vendor read from CPUID against the kernel's own report
// (/proc/cpuinfo), and the decode prefetch distance with its knob.
#include "core/cpu.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"

namespace ferry {
namespace {

// The vendor_id line of /proc/cpuinfo, or "" where there is none.
std::string cpuinfo_vendor() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("vendor_id", 0) == 0) return line.substr(line.find(':') + 2);
  return "";
}

TEST(Cpu, VendorMatchesTheKernelsReport) {
  const std::string v = cpuinfo_vendor();
  if (v.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo";
  const CpuVendor want = v == "GenuineIntel"   ? CpuVendor::Intel
                         : v == "AuthenticAMD" ? CpuVendor::Amd
                                               : CpuVendor::Other;
  EXPECT_EQ(cpu_features().vendor, want) << v;
}

// Without FERRY_CPU_PREFETCH the distance is the vendor's measured one.
TEST(Cpu, DecodePrefetchIsTheVendorsUnlessSet) {
  if (std::getenv("FERRY_CPU_PREFETCH") != nullptr) GTEST_SKIP() << "FERRY_CPU_PREFETCH is set";
  EXPECT_EQ(decode_prefetch_bytes(), cpu_features().vendor == CpuVendor::Amd ? 8192u : 3072u);
}

TEST(Cpu, PrefetchKnobTakesWholeByteCountsUpTo1MiB) {
  EXPECT_EQ(parse_prefetch_bytes("0"), 0u);
  EXPECT_EQ(parse_prefetch_bytes("8192"), 8192u);
  EXPECT_EQ(parse_prefetch_bytes("1048576"), 1048576u);
  for (const char* bad : {"", "-1", "4k", " 64", "1048577", "99999999999", "0x100"}) {
    try {
      parse_prefetch_bytes(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FERRY_CPU_PREFETCH"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ferry
