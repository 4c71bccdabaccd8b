// Where checkpoints live: one root every daemon sees, or a root per daemon. A value
// the coordinator, the tiers and the configuration share; pure functions.
#ifndef CKPTD_DAEMON_BASE_STORAGE_MODE_H_
#define CKPTD_DAEMON_BASE_STORAGE_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd {

// kShared: one root that every daemon sees (a parallel or network file system); rank 0
// publishes. kLocal: each daemon's own root on its own disk; every daemon publishes its
// copy of the index next to its own data file.
enum class Storage { kShared, kLocal };

// "shared" or "local"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Storage> ParseStorage(absl::string_view text);
absl::string_view StorageName(Storage storage);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_STORAGE_MODE_H_
