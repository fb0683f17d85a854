#pragma once
// splitmix64's output function (Steele, Lea and Flood 2014): a bijective mix of
// 64 bits, used to derive independent seeds from (seed, counter) keys.
#include <cstdint>

namespace cqk {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace cqk
