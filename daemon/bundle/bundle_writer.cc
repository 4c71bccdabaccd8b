// The writing half of the TF bundle format: IndexBuilder (ckpt.index, an SSTable
// built in memory) and DataFileWriter / WriteDataFile (data files appended with
// O_DIRECT while helper threads checksum the entries). See bundle.h.
#include <leveldb/comparator.h>
#include <leveldb/env.h>
#include <leveldb/options.h>
#include <leveldb/table_builder.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/bundle/ordered_code.h"

namespace ckptd {
namespace {

constexpr int kTensorBundleVersion = 1;

// The index is built in memory so that its bytes move through FileSystem.
class StringSink : public leveldb::WritableFile {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  leveldb::Status Append(const leveldb::Slice& data) override {
    out_->append(data.data(), data.size());
    return leveldb::Status::OK();
  }
  leveldb::Status Close() override { return leveldb::Status::OK(); }
  leveldb::Status Flush() override { return leveldb::Status::OK(); }
  leveldb::Status Sync() override { return leveldb::Status::OK(); }

 private:
  std::string* out_;
};

}  // namespace

absl::Status IndexBuilder::Add(std::string key, tf::BundleEntryProto entry) {
  if (key.empty()) return absl::InvalidArgumentError("the empty key is reserved for the header");
  entries_.emplace_back(std::move(key), std::move(entry));
  return absl::OkStatus();
}

absl::Status IndexBuilder::AddTensor(const std::string& name, int dtype, const Shape& shape,
                                     std::vector<std::pair<Box, tf::BundleEntryProto>> pieces) {
  for (auto& [box, entry] : pieces) {
    entry.set_dtype(dtype);
    *entry.mutable_shape() = ShapeToProto(box.length);
  }
  if (pieces.size() == 1 && pieces[0].first.IsFull(shape)) return Add(name, std::move(pieces[0].second));
  tf::BundleEntryProto full;
  full.set_dtype(dtype);
  *full.mutable_shape() = ShapeToProto(shape);
  for (auto& [box, entry] : pieces) {
    *full.add_slices() = BoxToSliceProto(box, shape);
    RETURN_IF_ERROR(Add(ordered_code::EncodeTensorNameSlice(name, box, shape), std::move(entry)));
  }
  return Add(name, std::move(full));
}

absl::StatusOr<std::unique_ptr<DataFileWriter>> DataFileWriter::Create(FileSystem* fs,
                                                                       const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewDirectWritableFile(path));
  return std::unique_ptr<DataFileWriter>(new DataFileWriter(fs, path, std::move(file)));
}

int64_t DataFileWriter::EntryOffset(int64_t end, int64_t bytes) {
  return bytes >= wire::kAlignLargeFrom ? wire::AlignUp(end, wire::kDirectIoAlignment) : end;
}

absl::StatusOr<int64_t> DataFileWriter::AppendUnchecked(absl::string_view bytes) {
  static const std::string* const kZeros =
      new std::string(static_cast<size_t>(wire::kDirectIoAlignment), '\0');
  const int64_t offset = EntryOffset(size_, static_cast<int64_t>(bytes.size()));
  if (offset > size_) RETURN_IF_ERROR(file_->Append(absl::string_view(kZeros->data(), offset - size_)));
  RETURN_IF_ERROR(file_->Append(bytes));
  size_ = offset + static_cast<int64_t>(bytes.size());
  return offset;
}

absl::StatusOr<DataFileWriter::Written> DataFileWriter::Append(int dtype, int64_t elements,
                                                               absl::string_view bytes) {
  ASSIGN_OR_RETURN(uint32_t crc, EntryChecksum(dtype, elements, bytes.data(), bytes.size()));
  ASSIGN_OR_RETURN(int64_t offset, AppendUnchecked(bytes));
  return Written{.offset = offset, .crc32c = crc};
}

absl::Status DataFileWriter::Finish() {
  RETURN_IF_ERROR(file_->Sync());
  RETURN_IF_ERROR(file_->Close());
  return fs_->SyncDir(DirName(path_));
}

absl::StatusOr<std::vector<DataFileWriter::Written>> WriteDataFile(FileSystem* fs, const std::string& path,
                                                                   std::vector<DataFileEntry>& entries,
                                                                   int checksum_threads,
                                                                   int64_t* file_bytes) {
  std::vector<DataFileWriter::Written> written(entries.size());
  std::vector<absl::Status> checksummed(entries.size());
  // Two owners per entry, the write and the checksum: the second to finish runs done.
  std::unique_ptr<std::atomic<int>[]> owners(new std::atomic<int>[entries.size()]);
  for (size_t i = 0; i < entries.size(); ++i) owners[i] = 2;
  auto release = [&](size_t i) {
    if (owners[i].fetch_sub(1) == 1 && entries[i].done) entries[i].done();
  };
  std::atomic<size_t> next_checksum{0};
  auto checksum = [&] {
    for (size_t i = next_checksum++; i < entries.size(); i = next_checksum++) {
      const DataFileEntry& e = entries[i];
      absl::StatusOr<uint32_t> crc = EntryChecksum(e.dtype, e.elements, e.bytes.data(), e.bytes.size());
      checksummed[i] = crc.status();
      if (crc.ok()) written[i].crc32c = *crc;
      release(i);
    }
  };
  std::vector<std::thread> checksummers;
  for (int i = 0; i < std::max(1, checksum_threads); ++i) checksummers.emplace_back(checksum);
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<DataFileWriter> file, DataFileWriter::Create(fs, path));
    for (size_t i = 0; i < entries.size(); ++i) {
      ASSIGN_OR_RETURN(written[i].offset, file->AppendUnchecked(entries[i].bytes));
      release(i);
    }
    *file_bytes = file->size();
    return file->Finish();
  }();
  for (std::thread& t : checksummers) t.join();
  RETURN_IF_ERROR(status);
  for (const absl::Status& s : checksummed) RETURN_IF_ERROR(s);
  return written;
}

absl::StatusOr<std::string> IndexBuilder::Finish() {
  // Keys in order, as the table needs them: sorted once here rather than kept in an
  // ordered map (a node and a comparison chain per entry, at 100,000 tensors a
  // measurable part of a commit).
  std::vector<const std::pair<std::string, tf::BundleEntryProto>*> sorted;
  sorted.reserve(entries_.size());
  for (const auto& e : entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->first == sorted[i - 1]->first) {
      return absl::AlreadyExistsError(absl::StrCat("duplicate index key '", sorted[i]->first, "'"));
    }
  }
  std::string out;
  StringSink sink(&out);
  leveldb::Options options;
  options.block_size = 256 * 1024;
  options.block_restart_interval = 16;
  options.compression = leveldb::kNoCompression;
  leveldb::TableBuilder builder(options, &sink);

  tf::BundleHeaderProto header;
  header.set_num_shards(num_shards_);
  header.set_endianness(tf::BundleHeaderProto::LITTLE);
  header.mutable_version()->set_producer(kTensorBundleVersion);
  builder.Add("", header.SerializeAsString());
  std::string value;
  for (const auto* entry : sorted) {
    entry->second.SerializeToString(&value);
    builder.Add(entry->first, value);
  }
  leveldb::Status s = builder.Finish();
  if (!s.ok()) return absl::InternalError(absl::StrCat("building index: ", s.ToString()));
  return out;
}

}  // namespace ckptd
