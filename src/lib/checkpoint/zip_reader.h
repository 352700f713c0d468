// checkpoint/zip_reader.h -- a read-only view of the ZIP archives torch.save writes.
//
// torch.save (PyTorch >= 1.6) writes an uncompressed ("stored") ZIP, with
// ZIP64 records once the file passes 4 GiB. This reader maps the file and
// hands out pointers into the mapping, so a record of hundreds of MB is never
// copied here. Every offset and size is checked against the file size before
// it is used; failures throw asap::Error prefixed with the caller's context.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace asap::detail {

// A whole file mapped read-only (empty files have data() == nullptr).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 = stored, 8 = deflate, ...
  uint16_t flags = 0;   // general purpose bit flags
  uint32_t crc32 = 0;
  uint64_t size = 0;         // uncompressed size
  uint64_t stored_size = 0;  // compressed size (== size when stored)
  uint64_t data_offset = 0;  // first data byte, after the local header
};

class ZipReader {
 public:
  // `context` prefixes every message, e.g. "checkpoint 'model.pt'".
  ZipReader(const uint8_t* data, std::size_t size, std::string context);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(std::string_view name) const;

  // The bytes of a stored entry, pointing into the caller's buffer. Refuses
  // compressed or encrypted entries and checks the CRC-32 unless it is 0
  // (newer torch versions can skip computing it and then write 0).
  std::string_view read(const ZipEntry& e) const;

 private:
  [[noreturn]] void fail(const std::string& what) const;
  void parse();

  const uint8_t* data_;
  std::size_t size_;
  std::string context_;
  std::vector<ZipEntry> entries_;
};

// CRC-32 (IEEE 802.3, as ZIP uses it) of a buffer, continuing from `crc`.
uint32_t crc32(const void* data, std::size_t size, uint32_t crc = 0);

}  // namespace asap::detail
