#include "daemon/bundle/bundle.h"

#include <leveldb/comparator.h>
#include <leveldb/env.h>
#include <leveldb/iterator.h>
#include <leveldb/options.h>
#include <leveldb/table.h>
#include <leveldb/table_builder.h>
#include <snappy.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/bundle/ordered_code.h"

namespace ckptd {
namespace {

constexpr int kMaxShards = 1 << 20;

// The index is parsed in memory so that its bytes move through FileSystem.
class StringSource : public leveldb::RandomAccessFile {
 public:
  explicit StringSource(const std::string* data) : data_(data) {}
  leveldb::Status Read(uint64_t offset, size_t n, leveldb::Slice* result, char* scratch) const override {
    if (offset > data_->size()) return leveldb::Status::Corruption("read past end of index");
    n = std::min<uint64_t>(n, data_->size() - offset);
    *result = leveldb::Slice(data_->data() + offset, n);
    return leveldb::Status::OK();
  }

 private:
  const std::string* data_;
};

bool IsSliceKey(const std::string& key) { return !key.empty() && key[0] == '\0'; }

// LevelDB sizes its read buffers from block handles in the file before it checks
// anything, so a hostile index could make it allocate gigabytes. Every handle it will
// follow (footer, index block, data blocks, and Snappy's declared lengths) is checked
// here against the file first.
bool GetVarint64(absl::string_view* in, uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift <= 63 && !in->empty(); shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *value = result;
      return true;
    }
  }
  return false;
}

struct BlockHandle {
  uint64_t offset = 0, size = 0;
};

constexpr uint64_t kTableMagic = 0xdb4775248b80fb57ull;
constexpr size_t kFooterSize = 48;
constexpr size_t kBlockTrailer = 5;  // type byte + crc32c
constexpr uint64_t kMaxSnappyRatio = 64;

// The block's bytes, uncompressed if Snappy, after checking its handle and sizes.
absl::StatusOr<std::string> CheckedBlock(const std::string& file, const BlockHandle& h) {
  if (h.offset > file.size() || h.size > file.size() - h.offset ||
      kBlockTrailer > file.size() - h.offset - h.size) {
    return absl::DataLossError("a block handle points past the end of the index");
  }
  const char* data = file.data() + h.offset;
  const char type = data[h.size];
  if (type == 0) return std::string(data, h.size);
  if (type != 1) return absl::DataLossError("unknown block compression");
  size_t length = 0;
  if (!snappy::GetUncompressedLength(data, h.size, &length) || length > kMaxSnappyRatio * (h.size + 64)) {
    return absl::DataLossError("a Snappy block declares an implausible length");
  }
  std::string out(length, '\0');
  if (!snappy::RawUncompress(data, h.size, out.data()))
    return absl::DataLossError("a Snappy block does not decode");
  return out;
}

absl::Status CheckTableLayout(const std::string& file) {
  if (file.size() < kFooterSize) return absl::DataLossError("shorter than a table footer");
  absl::string_view footer(file.data() + file.size() - kFooterSize, kFooterSize);
  uint64_t magic = 0;
  std::memcpy(&magic, footer.data() + kFooterSize - 8, 8);
  if (magic != kTableMagic) return absl::DataLossError("not a table (bad magic number)");
  BlockHandle meta, index;
  if (!GetVarint64(&footer, &meta.offset) || !GetVarint64(&footer, &meta.size) ||
      !GetVarint64(&footer, &index.offset) || !GetVarint64(&footer, &index.size)) {
    return absl::DataLossError("garbled table footer");
  }
  RETURN_IF_ERROR(CheckedBlock(file, meta).status());
  ASSIGN_OR_RETURN(std::string block, CheckedBlock(file, index));
  // Index block: entries (shared, non_shared, value_length, key delta, value), then
  // the restart array and its count. Each value is a data block's handle.
  if (block.size() < 4) return absl::DataLossError("index block too short");
  uint32_t restarts = 0;
  std::memcpy(&restarts, block.data() + block.size() - 4, 4);
  if (restarts > (block.size() - 4) / 4) return absl::DataLossError("index block restart array overflows");
  absl::string_view entries(block.data(), block.size() - 4 - 4 * static_cast<size_t>(restarts));
  while (!entries.empty()) {
    uint64_t shared = 0, non_shared = 0, value_length = 0;
    if (!GetVarint64(&entries, &shared) || !GetVarint64(&entries, &non_shared) ||
        !GetVarint64(&entries, &value_length) || non_shared > entries.size() ||
        value_length > entries.size() - non_shared) {
      return absl::DataLossError("garbled index block entry");
    }
    entries.remove_prefix(non_shared);
    absl::string_view value = entries.substr(0, value_length);
    entries.remove_prefix(value_length);
    BlockHandle data;
    if (!GetVarint64(&value, &data.offset) || !GetVarint64(&value, &data.size)) {
      return absl::DataLossError("garbled block handle");
    }
    RETURN_IF_ERROR(CheckedBlock(file, data).status());
  }
  return absl::OkStatus();
}

// A string tensor is stored as [varint64 length]... [masked crc of lengths][bytes]...,
// and TF's entry checksum covers each length as a little-endian uint32 (uint64 past
// 4 GiB), not as the varint bytes on disk, then the length checksum, then the bytes.
absl::StatusOr<uint32_t> StringTensorCrc(const char* data, size_t size, int64_t elements) {
  const auto malformed = absl::DataLossError("malformed string tensor");
  uint32_t crc = 0;
  absl::string_view lengths(data, size);
  uint64_t total = 0;
  for (int64_t i = 0; i < elements; ++i) {
    uint64_t len = 0;
    if (!GetVarint64(&lengths, &len)) return malformed;
    if (len <= UINT32_MAX) {
      const uint32_t len32 = static_cast<uint32_t>(len);
      crc = crc32c::Extend(crc, reinterpret_cast<const char*>(&len32), sizeof(len32));
    } else {
      crc = crc32c::Extend(crc, reinterpret_cast<const char*>(&len), sizeof(len));
    }
    total += len;
  }
  size_t pos = size - lengths.size();
  if (size - pos < 4) return malformed;
  uint32_t stored_length_crc;
  std::memcpy(&stored_length_crc, data + pos, 4);
  if (stored_length_crc != crc32c::Mask(crc)) return absl::DataLossError("string lengths checksum mismatch");
  crc = crc32c::Extend(crc, data + pos, 4);
  pos += 4;
  if (total != size - pos) return malformed;
  return crc32c::Extend(crc, data + pos, size - pos);
}

}  // namespace

absl::StatusOr<uint32_t> EntryChecksum(int dtype, int64_t elements, const char* data, size_t size) {
  if (dtype != kString) return crc32c::Mask(crc32c::Value(data, size));
  ASSIGN_OR_RETURN(uint32_t crc, StringTensorCrc(data, size, elements));
  return crc32c::Mask(crc);
}

std::string EncodeStringScalar(const std::string& value) {
  std::string out;
  uint64_t len = value.size();
  do {
    const uint8_t byte = static_cast<uint8_t>(len & 0x7f);
    len >>= 7;
    out.push_back(static_cast<char>(byte | (len != 0 ? 0x80 : 0)));
  } while (len != 0);
  uint32_t crc = 0;
  if (value.size() <= UINT32_MAX) {
    const uint32_t len32 = static_cast<uint32_t>(value.size());
    crc = crc32c::Value(reinterpret_cast<const char*>(&len32), 4);
  } else {
    const uint64_t len64 = value.size();
    crc = crc32c::Value(reinterpret_cast<const char*>(&len64), 8);
  }
  const uint32_t masked = crc32c::Mask(crc);
  out.append(reinterpret_cast<const char*>(&masked), 4);
  out += value;
  return out;
}

absl::StatusOr<std::vector<std::string>> DecodeStrings(absl::string_view encoded, int64_t count) {
  absl::string_view rest = encoded;
  std::vector<uint64_t> lengths;
  uint64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint64_t len = 0;
    if (!GetVarint64(&rest, &len) || len > encoded.size()) {
      return absl::DataLossError("malformed string tensor lengths");
    }
    total += len;
    lengths.push_back(len);
  }
  // The lengths' checksum (TF writes it even for no element); the entry's crc32c
  // covers it and everything else.
  if (rest.size() < 4 || rest.size() - 4 != total) {
    return absl::DataLossError(absl::StrCat("string tensor of ", count, " element(s): ", encoded.size(),
                                            " bytes do not match its lengths"));
  }
  rest.remove_prefix(4);
  std::vector<std::string> out;
  out.reserve(lengths.size());
  for (uint64_t len : lengths) {
    out.emplace_back(rest.substr(0, len));
    rest.remove_prefix(len);
  }
  return out;
}

absl::StatusOr<std::string> DecodeStringScalar(const std::string& encoded) {
  ASSIGN_OR_RETURN(std::vector<std::string> values, DecodeStrings(encoded, 1));
  return std::move(values[0]);
}

absl::StatusOr<std::unique_ptr<BundleReader>> BundleReader::Open(FileSystem* fs, const std::string& prefix,
                                                                 uint64_t max_index_bytes) {
  const std::string index_path = IndexPath(prefix);
  ASSIGN_OR_RETURN(std::string bytes, fs->ReadFileToString(index_path, max_index_bytes));
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(index_path, ": ", why));
  };

  if (absl::Status layout = CheckTableLayout(bytes); !layout.ok()) return corrupt(layout.message());
  StringSource source(&bytes);
  leveldb::Options options;
  options.paranoid_checks = true;  // verify the index block's checksum too
  leveldb::Table* raw_table = nullptr;
  leveldb::Status s = leveldb::Table::Open(options, &source, bytes.size(), &raw_table);
  if (!s.ok()) return corrupt(absl::StrCat("not a valid index table (", s.ToString(), ")"));
  std::unique_ptr<leveldb::Table> table(raw_table);

  std::unique_ptr<BundleReader> reader(new BundleReader(fs, prefix));
  leveldb::ReadOptions read_options;
  read_options.verify_checksums = true;
  std::unique_ptr<leveldb::Iterator> it(table->NewIterator(read_options));
  it->SeekToFirst();
  if (!it->Valid() || !it->key().empty()) {
    if (!it->status().ok()) return corrupt(it->status().ToString());
    return corrupt("no header entry");
  }
  if (!reader->header_.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
    return corrupt("header does not parse");
  }
  const int num_shards = reader->header_.num_shards();
  if (num_shards < 1 || num_shards > kMaxShards) {
    return corrupt(absl::StrCat("header declares ", num_shards, " shards"));
  }
  if (reader->header_.endianness() != tf::BundleHeaderProto::LITTLE) {
    return absl::UnimplementedError(absl::StrCat(index_path, ": big-endian bundles are not supported"));
  }
  reader->data_file_paths_.reserve(static_cast<size_t>(num_shards));
  for (int shard = 0; shard < num_shards; ++shard) {
    reader->data_file_paths_.push_back(DataPath(prefix, shard, num_shards));
  }
  for (it->Next(); it->Valid(); it->Next()) {
    std::string key = it->key().ToString();
    tf::BundleEntryProto entry;
    if (!entry.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return corrupt(absl::StrCat("entry '", key, "' does not parse"));
    }
    Shape shape = ShapeFromProto(entry.shape());
    int64_t elements = 0;
    if (absl::Status st = CheckShape(shape, &elements); !st.ok()) {
      return corrupt(absl::StrCat("entry '", key, "': ", st.message()));
    }
    if (entry.slices_size() == 0) {
      if (entry.shard_id() < 0 || entry.shard_id() >= num_shards) {
        return corrupt(absl::StrCat("entry '", key, "' names shard ", entry.shard_id(), " of ", num_shards));
      }
      if (entry.offset() < 0 || entry.size() < 0) {
        return corrupt(absl::StrCat("entry '", key, "' has a negative offset or size"));
      }
      const size_t element_size = DataTypeSize(entry.dtype());
      if (element_size != 0 && (elements > INT64_MAX / static_cast<int64_t>(element_size) ||
                                entry.size() != elements * static_cast<int64_t>(element_size))) {
        return corrupt(absl::StrCat("entry '", key, "' declares ", entry.size(),
                                    " bytes but its shape and dtype need ", elements, " x ", element_size));
      }
    }
    reader->by_key_[key] = reader->entries_.size();
    reader->entries_.emplace_back(std::move(key), std::move(entry));
  }
  if (!it->status().ok()) return corrupt(it->status().ToString());
  return reader;
}

std::vector<std::string> BundleReader::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [key, entry] : entries_) {
    if (!IsSliceKey(key)) names.push_back(key);
  }
  return names;
}

const tf::BundleEntryProto* BundleReader::Find(const std::string& key) const {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : &entries_[it->second].second;
}

absl::StatusOr<TensorInfo> BundleReader::Lookup(const std::string& name) const {
  const tf::BundleEntryProto* entry = Find(name);
  if (entry == nullptr || IsSliceKey(name)) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' is not in ", IndexPath(prefix_)));
  }
  TensorInfo info;
  info.name = name;
  info.dtype = entry->dtype();
  info.shape = ShapeFromProto(entry->shape());
  if (entry->slices_size() == 0) {
    info.pieces.push_back(
        {Box::Full(info.shape), name, PieceLabel(name, Box::Full(info.shape), info.shape, false), *entry});
    return info;
  }
  for (const tf::TensorSliceProto& slice : entry->slices()) {
    Box box = SliceProtoToBox(slice, info.shape);
    if (absl::Status st = CheckBoxInShape(box, info.shape); !st.ok()) {
      return absl::DataLossError(
          absl::StrCat(IndexPath(prefix_), ": tensor '", name, "' lists slice ", st.message()));
    }
    std::string key = ordered_code::EncodeTensorNameSlice(name, box, info.shape);
    const tf::BundleEntryProto* piece = Find(key);
    if (piece == nullptr) {
      return absl::DataLossError(absl::StrCat(IndexPath(prefix_), ": tensor '", name, "' lists slice ",
                                              box.ToSliceString(info.shape), " but has no entry for it"));
    }
    if (piece->dtype() != info.dtype || ShapeFromProto(piece->shape()) != box.length) {
      return absl::DataLossError(absl::StrCat(IndexPath(prefix_), ": slice ", box.ToSliceString(info.shape),
                                              " of tensor '", name, "' disagrees with its tensor"));
    }
    std::string label = PieceLabel(name, box, info.shape, true);
    info.pieces.push_back({std::move(box), std::move(key), std::move(label), *piece});
  }
  return info;
}

std::string BundleReader::DataFile(int shard) const {
  if (shard >= 0 && static_cast<size_t>(shard) < data_file_paths_.size()) return data_file_paths_[shard];
  return DataPath(prefix_, shard, header_.num_shards());
}

absl::StatusOr<RandomAccessFile*> BundleReader::DataFileHandle(int shard) {
  auto it = data_files_.find(shard);
  if (it != data_files_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> opened = fs_->NewRandomAccessFile(DataFile(shard));
  if (absl::IsNotFound(opened.status())) {
    return absl::DataLossError(absl::StrCat("data file ", DataFile(shard), " is missing"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, std::move(opened));
  RandomAccessFile* raw = file.get();
  data_files_.emplace(shard, std::move(file));
  return raw;
}

absl::Status BundleReader::OpenAllDataFiles() {
  for (int shard = 0; shard < header_.num_shards(); ++shard) RETURN_IF_ERROR(DataFileHandle(shard).status());
  return absl::OkStatus();
}

int BundleReader::VerifyAll(std::vector<std::string>* problems, int64_t* bytes_checked,
                            const std::function<void(int64_t, int64_t)>& progress,
                            const std::set<int>& shards) {
  int checked = 0;
  std::string buffer;
  int64_t total = 0, done = 0;
  auto wanted = [&](const tf::BundleEntryProto& entry) {
    return entry.slices_size() == 0 && (shards.empty() || shards.count(entry.shard_id()) > 0);
  };
  for (const auto& [key, entry] : entries_) {
    if (wanted(entry)) total += entry.size();
  }
  // Slice keys are binary (OrderedCode): problems name the tensor and slice instead.
  std::map<std::string, std::string> display;
  for (const std::string& name : TensorNames()) {
    auto info = Lookup(name);
    if (!info.ok()) continue;
    for (const SavedPiece& p : info->pieces) display[p.key] = p.label;
  }
  for (const auto& [raw_key, entry] : entries_) {
    if (!wanted(entry)) continue;  // a sliced entry holds no bytes (its slices are entries)
    // A slice no tensor lists keeps a printable form of its key.
    auto shown = display.find(raw_key);
    const std::string key = shown != display.end() ? shown->second
                            : IsSliceKey(raw_key)  ? absl::StrCat("'", absl::CEscape(raw_key), "'")
                                                   : absl::StrCat("'", raw_key, "'");
    ++checked;
    done += entry.size();
    struct Report {
      const std::function<void(int64_t, int64_t)>& progress;
      int64_t done, total;
      ~Report() {
        if (progress) progress(done, total);
      }
    } report{progress, done, total};
    absl::Status s = CheckEntryRange(key, entry);
    if (s.ok()) {
      buffer.resize(static_cast<size_t>(entry.size()));
      s = ReadEntry(key, entry, buffer.data());
    }
    if (s.ok()) {
      *bytes_checked += entry.size();
    } else {
      problems->push_back(std::string(s.message()));
    }
  }
  for (const std::string& name : TensorNames()) {
    if (auto info = Lookup(name); !info.ok()) problems->push_back(std::string(info.status().message()));
  }
  return checked;
}

absl::Status BundleReader::CheckEntryRange(absl::string_view label, const tf::BundleEntryProto& entry) {
  auto file = DataFileHandle(entry.shard_id());
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("tensor ", label, ": ", file.status().message()));
  }
  const uint64_t size = (*file)->Size();
  if (static_cast<uint64_t>(entry.offset()) > size ||
      static_cast<uint64_t>(entry.size()) > size - entry.offset()) {
    return absl::DataLossError(absl::StrCat("tensor ", label, ": bytes [", entry.offset(), ", +",
                                            entry.size(), ") lie past the end of ",
                                            DataFile(entry.shard_id()), " (", size, " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status BundleReader::ReadEntry(const std::string& label, const tf::BundleEntryProto& entry, char* dst) {
  RETURN_IF_ERROR(CheckEntryRange(label, entry));
  auto file = DataFileHandle(entry.shard_id());
  const char* held =
      (*file)->InMemory(static_cast<uint64_t>(entry.offset()), static_cast<size_t>(entry.size()));
  if (held != nullptr) {
    std::memcpy(dst, held, static_cast<size_t>(entry.size()));
    return absl::OkStatus();
  }
  absl::Status s =
      (*file)->Read(static_cast<uint64_t>(entry.offset()), static_cast<size_t>(entry.size()), dst);
  if (absl::IsOutOfRange(s)) {
    return absl::DataLossError(absl::StrCat("tensor ", label, ": ", s.message()));
  }
  RETURN_IF_ERROR(s);
  return CheckEntryBytes(label, entry, dst);
}

const char* BundleReader::KeptEntry(const tf::BundleEntryProto& entry) {
  if (!CheckEntryRange("", entry).ok()) return nullptr;
  absl::StatusOr<RandomAccessFile*> file = DataFileHandle(entry.shard_id());
  if (!file.ok()) return nullptr;
  return (*file)->InMemory(static_cast<uint64_t>(entry.offset()), static_cast<size_t>(entry.size()));
}

absl::Status BundleReader::ReadEntries(uint64_t offset, uint64_t span, const std::vector<EntryRead>& reads) {
  if (reads.empty()) return absl::OkStatus();
  const int shard = reads.front().entry->shard_id();
  for (const EntryRead& r : reads) {
    RETURN_IF_ERROR(CheckEntryRange(r.label, *r.entry));
    if (r.entry->shard_id() != shard || static_cast<uint64_t>(r.entry->offset()) < offset ||
        static_cast<uint64_t>(r.entry->offset() + r.entry->size()) > offset + span) {
      return absl::InternalError(absl::StrCat("ReadEntries: ", r.label, " lies outside the span"));
    }
  }
  auto file = DataFileHandle(shard);
  // Not zeroed: every byte of it is read over (a short read fails).
  const std::unique_ptr<char[]> buffer = std::make_unique_for_overwrite<char[]>(static_cast<size_t>(span));
  absl::Status s = (*file)->Read(offset, static_cast<size_t>(span), buffer.get());
  if (absl::IsOutOfRange(s)) {
    return absl::DataLossError(absl::StrCat("tensor ", reads.front().label, ": ", s.message()));
  }
  RETURN_IF_ERROR(s);
  for (const EntryRead& r : reads) {
    const char* bytes = buffer.get() + (r.entry->offset() - offset);
    RETURN_IF_ERROR(CheckEntryBytes(r.label, *r.entry, bytes));
    std::memcpy(r.dst, bytes, static_cast<size_t>(r.entry->size()));
  }
  return absl::OkStatus();
}

absl::Status BundleReader::CheckEntryBytes(absl::string_view label, const tf::BundleEntryProto& entry,
                                           const char* data) const {
  int64_t elements = 1;
  for (const auto& dim : entry.shape().dim()) elements *= dim.size();
  absl::StatusOr<uint32_t> actual =
      EntryChecksum(entry.dtype(), elements, data, static_cast<size_t>(entry.size()));
  if (!actual.ok()) {
    return absl::DataLossError(absl::StrCat("tensor ", label, ": ", actual.status().message(), " in ",
                                            DataFile(entry.shard_id()), " at offset ", entry.offset()));
  }
  if (*actual != entry.crc32c()) {
    return absl::DataLossError(absl::StrCat("tensor ", label, ": checksum mismatch in ",
                                            DataFile(entry.shard_id()), " at offset ", entry.offset(), " (",
                                            entry.size(), " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status BundleReader::CheckBoxReadable(const TensorInfo& info, const Box& box) {
  int64_t covered = 0;
  for (const SavedPiece& piece : info.pieces) {
    std::optional<Box> common = Intersect(piece.box, box);
    if (!common.has_value() && !(piece.box == box)) continue;
    RETURN_IF_ERROR(CheckEntryRange(piece.label, piece.entry));
    covered += common.has_value() ? common->NumElements() : box.NumElements();
  }
  if (covered != box.NumElements()) {
    return absl::DataLossError(absl::StrCat("tensor '", info.name, "': saved slices cover ", covered,
                                            " of the ", box.NumElements(), " elements requested"));
  }
  return absl::OkStatus();
}

absl::Status BundleReader::ReadBox(const TensorInfo& info, const Box& box, char* dst) {
  const size_t element_size = DataTypeSize(info.dtype);
  if (element_size == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor '", info.name, "' has dtype ", DataTypeName(info.dtype), ", which restore does not support"));
  }
  int64_t covered = 0;
  // Page-aligned, so that large reads can bypass the page cache.
  std::unique_ptr<char, decltype(&std::free)> buffer(nullptr, &std::free);
  size_t buffer_size = 0;
  for (const SavedPiece& piece : info.pieces) {
    // A piece equal to the request is read straight into place.
    if (piece.box == box) return ReadEntry(piece.label, piece.entry, dst);
    std::optional<Box> common = Intersect(piece.box, box);
    if (!common.has_value()) continue;
    RETURN_IF_ERROR(CheckEntryRange(piece.label, piece.entry));
    // A piece that is one contiguous run of the request is read straight into place
    // too (e.g. row blocks of a row-resharded tensor).
    if (*common == piece.box) {
      if (std::optional<int64_t> at = ContiguousOffset(piece.box, box); at.has_value()) {
        RETURN_IF_ERROR(ReadEntry(piece.label, piece.entry, dst + *at * static_cast<int64_t>(element_size)));
        covered += common->NumElements();
        continue;
      }
    }
    const size_t size = static_cast<size_t>(piece.entry.size());
    if (size > buffer_size) {
      void* p = nullptr;
      if (posix_memalign(&p, wire::kDirectIoAlignment, std::max<size_t>(size, 1)) != 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("tensor '", info.name, "': no memory to read ", size, " bytes"));
      }
      buffer.reset(static_cast<char*>(p));
      buffer_size = size;
    }
    RETURN_IF_ERROR(ReadEntry(piece.label, piece.entry, buffer.get()));
    CopyRegion(*common, piece.box, buffer.get(), box, dst, element_size);
    covered += common->NumElements();
  }
  if (covered != box.NumElements()) {
    return absl::DataLossError(absl::StrCat("tensor '", info.name, "': saved slices cover ", covered,
                                            " of the ", box.NumElements(), " elements requested"));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
