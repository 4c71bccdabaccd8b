#include "daemon/base/storage_mode.h"

#include "absl/strings/str_cat.h"

namespace ckptd {

absl::StatusOr<Storage> ParseStorage(absl::string_view text) {
  if (text == "shared") return Storage::kShared;
  if (text == "local") return Storage::kLocal;
  return absl::InvalidArgumentError(absl::StrCat("storage: '", text, "' is neither 'shared' nor 'local'"));
}

absl::string_view StorageName(Storage storage) { return storage == Storage::kLocal ? "local" : "shared"; }

}  // namespace ckptd
