// What client.cc and client_restore.cc share inside the client library; not
// installed, not part of the API.
#ifndef CKPTD_CLIENT_CLIENT_INTERNAL_H_
#define CKPTD_CLIENT_CLIENT_INTERNAL_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckptd/client.h"
#include "ckptd/v1/ckptd.pb.h"

// Returns a StatusOr's status from the calling function, or assigns its value.
#define ASSIGN_OR_RETURN_CLIENT(lhs, expr)      \
  do {                                          \
    auto result_ = (expr);                      \
    if (!result_.ok()) return result_.status(); \
    lhs = std::move(*result_);                  \
  } while (0)

// Returns a non-OK status from the calling function.
#define RETURN_IF_ERROR_CLIENT(expr)     \
  do {                                   \
    const absl::Status status_ = (expr); \
    if (!status_.ok()) return status_;   \
  } while (0)

namespace ckptd::client_internal {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout);
void SetBox(v1::Box* box, const std::vector<int64_t>& start, const std::vector<int64_t>& length);
void SetDeviceMemory(v1::DeviceMemory* out, const DeviceMemory& in);
// Errors that say the daemon cannot map this client's segments at all (another
// host, another user): streaming will work where shared memory does not.
bool SharedMemoryUnusable(const absl::Status& s);
// " (from $CKPTD_ADDRESS)", " (the default socket)", or "" for an address given:
// how a Connect's target was chosen.
std::string HowAddressWasChosen(const std::string& address);
// For a unix-socket target: UNAVAILABLE at once when no file is there or nothing
// accepts on it, saying which and what to do. OK otherwise (TCP targets too).
absl::Status CheckSocketListening(const std::string& target, const std::string& chosen);

}  // namespace ckptd::client_internal

#endif  // CKPTD_CLIENT_CLIENT_INTERNAL_H_
