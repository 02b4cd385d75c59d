// Linux hands a process the AMX tile registers' state (XTILEDATA) only once the process asks for it
// (arch_prctl ARCH_REQ_XCOMP_PERM); oneDNN asks the same. Shared by the extension libraries that run tiles.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

namespace jido_tiles {

// Whether this process may use the tile state: asked once, the first time. The caller checks the CPU's features.
inline bool state_granted() {
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return granted;
}

}  // namespace jido_tiles
