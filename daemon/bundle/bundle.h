// TensorFlow's V2 checkpoint format (tensor_bundle): PREFIX.index, an SSTable in
// LevelDB's table format mapping "" to a BundleHeaderProto and every other key to a
// BundleEntryProto, and PREFIX.data-%05d-of-%05d holding the raw bytes.
// IndexBuilder and BundleReader do no locking: one thread per object. All file access
// goes through the FileSystem passed in, which must outlive the reader.
#ifndef CKPTD_DAEMON_BUNDLE_BUNDLE_H_
#define CKPTD_DAEMON_BUNDLE_BUNDLE_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckptd/v1/tensor_bundle.pb.h"
#include "daemon/io/file_system.h"
#include "daemon/layout/box.h"

namespace ckptd {

std::string IndexPath(const std::string& prefix);
std::string DataPath(const std::string& prefix, int shard, int num_shards);
// The inverse for a step's own files: true, with shard and num_shards, when the file
// name of `path` is exactly DataPath("ckpt", shard, num_shards).
bool ParseDataFileName(const std::string& path, int* shard, int* num_shards);
// With parity (config redundancy: parity): rank `rank`'s parity file of a step that
// `num_ranks` saved, "<prefix>.parity-RRRRR-of-NNNNN", and the inverse for a step's
// own files.
std::string ParityPath(const std::string& prefix, int rank, int num_ranks);
bool ParseParityFileName(const std::string& path, int* rank, int* num_ranks);

// Box <-> TF's TensorSliceProto (a dimension covered whole has no length).
tf::TensorSliceProto BoxToSliceProto(const Box& box, const Shape& shape);
Box SliceProtoToBox(const tf::TensorSliceProto& slice, const Shape& shape);
Shape ShapeFromProto(const tf::TensorShapeProto& proto);
tf::TensorShapeProto ShapeToProto(const Shape& shape);

// The masked crc32c TF stores for an entry's bytes. For string tensors TF checksums
// each length as a fixed-width integer, not the varint bytes on disk, so the bytes
// must parse as a string tensor of `elements` strings (DATA_LOSS otherwise).
absl::StatusOr<uint32_t> EntryChecksum(int dtype, int64_t elements, const char* data, size_t size);

// A string scalar in TF's on-disk form, and back (the reverse checks nothing; pair it
// with EntryChecksum).
std::string EncodeStringScalar(const std::string& value);
absl::StatusOr<std::string> DecodeStringScalar(const std::string& encoded);
// The elements of a string tensor of `count` elements in TF's tensor_bundle encoding:
// `count` varint64 lengths, a 4-byte checksum of them, then the bytes. DATA_LOSS when
// `encoded` is not such a thing.
absl::StatusOr<std::vector<std::string>> DecodeStrings(absl::string_view encoded, int64_t count);

// ckptd's own tensors in a bundle live under this prefix, which no user tensor may
// take. Trainer `trainer_id`'s opaque state `key` is the string scalar named
// TrainerStateName(trainer_id, key), under kTrainerStatePrefix: no two collide.
inline constexpr char kReservedNamePrefix[] = "_ckptd/";
inline constexpr char kTrainerStatePrefix[] = "_ckptd/trainer_state/";
std::string TrainerStateName(int trainer_id, const std::string& key);

// Collects index entries in any order and serializes them, sorted, as LevelDB writes a
// table: block size 256 KiB, restart interval 16, no compression.
class IndexBuilder {
 public:
  explicit IndexBuilder(int num_shards) : num_shards_(num_shards) {}
  // "" is reserved for the header.
  absl::Status Add(std::string key, tf::BundleEntryProto entry);
  // One tensor saved as `pieces` (each box with the entry of its bytes: shard, offset,
  // size, crc32c; dtype and shape are filled in here). One piece covering the whole
  // tensor is a plain entry; otherwise TF's sliced layout: a full-tensor entry listing
  // the slices and holding no bytes, plus one entry per slice under the OrderedCode key
  // of name and slice (the layout BundleReader::Lookup decodes).
  absl::Status AddTensor(const std::string& name, int dtype, const Shape& shape,
                         std::vector<std::pair<Box, tf::BundleEntryProto>> pieces);
  // The index file's bytes; ALREADY_EXISTS when a key was added twice.
  absl::StatusOr<std::string> Finish();

 private:
  int num_shards_;
  std::vector<std::pair<std::string, tf::BundleEntryProto>> entries_;  // in the order added
};

// How messages and logs name one saved piece, as people write it: `'w'` for a whole
// tensor, `'opt/m' slice 0,16:-` for a slice (never the binary OrderedCode key).
std::string PieceLabel(const std::string& name, const Box& box, const Shape& shape, bool sliced);

// Writes one data file of a bundle through the FileSystem's O_DIRECT writer: entries
// in order, each of wire::kAlignLargeFrom bytes or more starting at a 4 KiB-aligned
// offset (zero padding before it), so that large entries go to disk straight from
// the caller's memory and are read back with O_DIRECT. One thread at a time.
class DataFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<DataFileWriter>> Create(FileSystem* fs, const std::string& path);
  // Where an entry of `bytes` bytes starts when the file so far ends at `end`.
  static int64_t EntryOffset(int64_t end, int64_t bytes);

  struct Written {
    int64_t offset = 0;
    uint32_t crc32c = 0;  // masked, as TF stores it
  };
  // Appends one entry and checksums it (see EntryChecksum for string tensors).
  absl::StatusOr<Written> Append(int dtype, int64_t elements, absl::string_view bytes);
  // Appends one entry whose checksum the caller computes elsewhere (on other threads,
  // while this one writes); returns its offset.
  absl::StatusOr<int64_t> AppendUnchecked(absl::string_view bytes);
  // Syncs and closes the file and syncs its directory: the bytes are durable.
  absl::Status Finish();
  int64_t size() const { return size_; }

 private:
  DataFileWriter(FileSystem* fs, std::string path, std::unique_ptr<WritableFile> file)
      : fs_(fs), path_(std::move(path)), file_(std::move(file)) {}
  FileSystem* fs_;
  std::string path_;
  std::unique_ptr<WritableFile> file_;
  int64_t size_ = 0;
};

// One entry for WriteDataFile: its bytes, the dtype and element count its checksum
// needs, and what to run once it is both written and checksummed (to free the bytes
// as early as possible).
struct DataFileEntry {
  int dtype = 0;
  int64_t elements = 0;
  absl::string_view bytes{};
  std::function<void()> done{};
};

// Writes `entries` in order into a new data file at `path` and makes it durable,
// checksumming them on `checksum_threads` helper threads while the calling thread
// writes. Returns each entry's offset and crc32c, in order, and the file's size in
// *file_bytes. After a failed write, entries it did not reach never run `done`.
absl::StatusOr<std::vector<DataFileWriter::Written>> WriteDataFile(FileSystem* fs, const std::string& path,
                                                                   std::vector<DataFileEntry>& entries,
                                                                   int checksum_threads, int64_t* file_bytes);

// One saved piece of a tensor: its box and the entry holding its bytes.
struct SavedPiece {
  Box box;
  std::string key;    // the index key (binary for a slice)
  std::string label;  // PieceLabel: what errors print
  tf::BundleEntryProto entry;
};

struct TensorInfo {
  std::string name;
  int dtype = 0;
  Shape shape;
  std::vector<SavedPiece> pieces;  // one for a plain entry, one per slice otherwise
};

class BundleReader {
 public:
  // Reads and checks the whole index (block checksums, header, every entry's fields).
  // A missing, truncated or garbled index is DATA_LOSS or NOT_FOUND naming the file.
  static absl::StatusOr<std::unique_ptr<BundleReader>> Open(FileSystem* fs, const std::string& prefix,
                                                            uint64_t max_index_bytes = 1ull << 30);

  const tf::BundleHeaderProto& header() const { return header_; }
  const std::string& prefix() const { return prefix_; }
  // Every entry but the header, in key order (slice entries included).
  const std::vector<std::pair<std::string, tf::BundleEntryProto>>& entries() const { return entries_; }
  // Tensor names: keys that are not slice keys.
  std::vector<std::string> TensorNames() const;
  const tf::BundleEntryProto* Find(const std::string& key) const;

  // NOT_FOUND for an unknown name; DATA_LOSS if a listed slice has no entry.
  absl::StatusOr<TensorInfo> Lookup(const std::string& name) const;

  // DATA_LOSS naming the piece (`label`, see PieceLabel) and file if the entry's byte
  // range is not inside its data file (checked before anything is allocated for it).
  absl::Status CheckEntryRange(absl::string_view label, const tf::BundleEntryProto& entry);
  // Reads one entry's bytes into dst (entry.size() bytes) and checks its crc32c.
  // DATA_LOSS naming the piece and file on a mismatch or a range past the file's end.
  absl::Status ReadEntry(const std::string& label, const tf::BundleEntryProto& entry, char* dst);
  // Where the entry's bytes already lie in memory, checked (RandomAccessFile::InMemory),
  // so that a caller may send them from there without copying or reading them; null
  // when they do not, or when its data file cannot be opened (ReadEntry says why).
  const char* KeptEntry(const tf::BundleEntryProto& entry);
  // One entry of a ReadEntries batch.
  struct EntryRead {
    absl::string_view label;  // the piece's label, outliving the call
    const tf::BundleEntryProto* entry;
    char* dst;
  };
  // Reads entries of one data file lying in order within [offset, offset + span) of
  // it (reads[0] starting at offset) with one read of the whole span, then checks
  // and places each as ReadEntry does: many small entries cost one request, not one
  // each. The bytes between entries are read and ignored.
  absl::Status ReadEntries(uint64_t offset, uint64_t span, const std::vector<EntryRead>& reads);

  // Checks, before anything is allocated for it, that `box` can be read: the pieces
  // intersecting it cover it and their byte ranges lie inside their data files.
  // Index sizes are only trusted after this.
  absl::Status CheckBoxReadable(const TensorInfo& info, const Box& box);

  // Assembles `box` of tensor `info` into dst (box elements x dtype size bytes) from
  // every saved piece that intersects it; reads nothing else.
  absl::Status ReadBox(const TensorInfo& info, const Box& box, char* dst);

  // Opens every data file now, so that the files stay readable even if the step is
  // deleted later (retention). NOT_FOUND becomes DATA_LOSS: a committed checkpoint
  // with a missing data file has lost data.
  absl::Status OpenAllDataFiles();
  // The same for one data file.
  absl::Status OpenDataFile(int shard) { return DataFileHandle(shard).status(); }

  // Reads every entry and checks every checksum; one line per problem found
  // (naming tensor and file) in *problems. Returns the number of entries checked.
  // `progress`, when set, is called after each entry with (bytes done, bytes in all).
  // `shards`, when not empty, limits the check to entries in those data files (one
  // host's part of a checkpoint on local disks).
  int VerifyAll(std::vector<std::string>* problems, int64_t* bytes_checked,
                const std::function<void(int64_t, int64_t)>& progress = nullptr,
                const std::set<int>& shards = {});

  // The path of data file `shard` (named once per reader: a restore asks for every piece).
  std::string DataFile(int shard) const;

 private:
  // Checks the crc32c of one entry's bytes (already read into data); DATA_LOSS
  // naming the piece and file on a mismatch.
  absl::Status CheckEntryBytes(absl::string_view label, const tf::BundleEntryProto& entry,
                               const char* data) const;
  BundleReader(FileSystem* fs, std::string prefix) : fs_(fs), prefix_(std::move(prefix)) {}
  absl::StatusOr<RandomAccessFile*> DataFileHandle(int shard);

  FileSystem* fs_;
  std::string prefix_;
  tf::BundleHeaderProto header_;
  std::vector<std::pair<std::string, tf::BundleEntryProto>> entries_;
  absl::flat_hash_map<std::string, size_t> by_key_;  // index into entries_
  std::map<int, std::unique_ptr<RandomAccessFile>> data_files_;
  std::vector<std::string> data_file_paths_;  // DataFile of each shard, from Open
};

// TensorFlow's `checkpoint` state file (text proto): model_checkpoint_path and
// all_model_checkpoint_paths.
struct CheckpointState {
  std::string model_checkpoint_path;
  std::vector<std::string> all_model_checkpoint_paths;
};
absl::StatusOr<CheckpointState> ParseCheckpointState(const std::string& text);
std::string FormatCheckpointState(const CheckpointState& state);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BUNDLE_BUNDLE_H_
