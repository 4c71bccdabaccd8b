#include "restore_stream.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace ckptd::internal {
namespace {

// Reads protobuf wire format across slice boundaries.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  size_t position() const { return position_; }
  bool AtEnd() {
    while (slice_ < slices_.size() && within_ == slices_[slice_].size()) NextSlice();
    return slice_ == slices_.size();
  }
  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (AtEnd()) return false;
      const uint8_t byte = slices_[slice_].begin()[within_];
      ++within_;
      ++position_;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;  // longer than ten bytes
  }
  // Hands the next n bytes to fn as contiguous runs; false if fewer remain.
  template <typename Fn>
  bool Take(uint64_t n, Fn fn) {
    while (n > 0) {
      if (AtEnd()) return false;
      const grpc::Slice& s = slices_[slice_];
      const size_t run = static_cast<size_t>(std::min<uint64_t>(n, s.size() - within_));
      fn(reinterpret_cast<const char*>(s.begin()) + within_, run);
      within_ += run;
      position_ += run;
      n -= run;
    }
    return true;
  }
  bool Skip(uint64_t n) {
    return Take(n, [](const char*, size_t) {});
  }
  bool SkipField(uint64_t wire_type) {
    uint64_t n = 0;
    switch (wire_type) {
      case 0:
        return ReadVarint(&n);
      case 1:
        return Skip(8);
      case 2:
        return ReadVarint(&n) && Skip(n);
      case 5:
        return Skip(4);
      default:
        return false;  // groups are not in proto3
    }
  }

 private:
  void NextSlice() {
    ++slice_;
    within_ = 0;
  }
  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0, within_ = 0, position_ = 0;
};

constexpr uint64_t kVarint = 0, kDelimited = 2;

absl::Status Malformed(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("the daemon sent a malformed RestoreResponse (", what, ")"));
}

absl::Status ParseChunk(SliceCursor& cursor, uint64_t length, RawRestoreResponse* out) {
  const size_t end = cursor.position() + length;
  while (cursor.position() < end) {
    uint64_t tag = 0, value = 0;
    if (!cursor.ReadVarint(&tag)) return Malformed("chunk field tag");
    const uint64_t field = tag >> 3, wire_type = tag & 7;
    if (field == 1 && wire_type == kVarint) {
      if (!cursor.ReadVarint(&value)) return Malformed("tensor_index");
      out->tensor_index = static_cast<int32_t>(value);  // int32 on the wire, sign-extended
    } else if (field == 2 && wire_type == kVarint) {
      if (!cursor.ReadVarint(&value)) return Malformed("offset");
      out->offset = static_cast<int64_t>(value);
    } else if (field == 3 && wire_type == kDelimited) {
      // A repeated singular field replaces the earlier value, as protobuf parses it.
      out->data.clear();
      out->data_size = 0;
      if (!cursor.ReadVarint(&value) ||
          !cursor.Take(value, [out](const char* p, size_t n) { out->data.emplace_back(p, n); })) {
        return Malformed("data");
      }
      out->data_size = static_cast<size_t>(value);
    } else if (!cursor.SkipField(wire_type)) {
      return Malformed("chunk field");
    }
  }
  if (cursor.position() != end) return Malformed("chunk length");
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRestoreResponse(const std::vector<grpc::Slice>& slices, RawRestoreResponse* out) {
  *out = RawRestoreResponse();
  SliceCursor cursor(slices);
  while (!cursor.AtEnd()) {
    uint64_t tag = 0, length = 0;
    if (!cursor.ReadVarint(&tag)) return Malformed("field tag");
    const uint64_t field = tag >> 3, wire_type = tag & 7;
    if (field >= 1 && field <= 4 && wire_type == kDelimited) {
      if (!cursor.ReadVarint(&length)) return Malformed("length");
      // The payload is a oneof: the last member parsed wins.
      out->has_header = field == 1;
      out->has_chunk = field == 2;
      out->has_trailer = field == 3;
      out->has_ready = field == 4;
      if (field == 2) {
        if (absl::Status s = ParseChunk(cursor, length, out); !s.ok()) return s;
        continue;
      }
      // A header, trailer or ready: small, parsed by protobuf.
      struct Small {
        google::protobuf::MessageLite* message;
        const char* name;
      };
      const Small small = field == 1   ? Small{&out->header, "header"}
                          : field == 3 ? Small{&out->trailer, "trailer"}
                                       : Small{&out->ready, "ready"};
      std::string bytes;
      if (!cursor.Take(length, [&bytes](const char* p, size_t n) { bytes.append(p, n); }) ||
          !small.message->MergeFromString(bytes)) {
        return Malformed(small.name);
      }
    } else if (!cursor.SkipField(wire_type)) {
      return Malformed("field");
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd::internal
