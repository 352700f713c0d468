// Minimal ZIP reader for torch.save archives; see zip_reader.h.
#include "checkpoint/zip_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "asap/error.h"

namespace asap::detail {

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASAP_CHECK(fd >= 0, "cannot open checkpoint '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    ASAP_CHECK(false, "cannot read checkpoint '", path, "': ", err ? std::strerror(err) : "not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    // Mapping instead of reading: only the pages of records we use get touched.
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    ASAP_CHECK(p != MAP_FAILED, "cannot map checkpoint '", path, "' into memory: ", std::strerror(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr std::size_t kEndSize = 22, kCentralSize = 46, kLocalSize = 30;
constexpr std::size_t kZip64EndSize = 56, kZip64LocatorSize = 20;

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t le64(const uint8_t* p) { return uint64_t(le32(p)) | uint64_t(le32(p + 4)) << 32; }

// Slicing-by-8 tables: records can be hundreds of MB, a byte-at-a-time CRC is slow.
struct CrcTables {
  uint32_t t[8][256];
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

}  // namespace

uint32_t crc32(const void* data, std::size_t size, uint32_t crc) {
  static const CrcTables tables;
  const auto& t = tables.t;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint32_t lo = le32(p) ^ crc, hi = le32(p + 4);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
          t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; size > 0; ++p, --size) crc = t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
  return ~crc;
}

ZipReader::ZipReader(const uint8_t* data, std::size_t size, std::string context)
    : data_(data), size_(size), context_(std::move(context)) {
  parse();
}

void ZipReader::fail(const std::string& what) const { throw Error(context_ + ": " + what); }

void ZipReader::parse() {
  // The end-of-central-directory record sits in the last 22 + 65535 bytes
  // (its comment can be up to 64 KiB). Prefer a record whose comment ends
  // exactly at the end of the file; a match inside data would not.
  if (size_ < kEndSize) fail(str("not a complete zip archive (only ", size_, " bytes; the file is truncated)"));
  std::size_t lowest = size_ - kEndSize > 65535 ? size_ - kEndSize - 65535 : 0;
  std::size_t end = SIZE_MAX, loose = SIZE_MAX;
  for (std::size_t p = size_ - kEndSize + 1; p-- > lowest;) {
    if (le32(data_ + p) != kEndSig) continue;
    std::size_t comment = le16(data_ + p + 20);
    if (p + kEndSize + comment == size_) {
      end = p;
      break;
    }
    if (loose == SIZE_MAX && p + kEndSize + comment <= size_) loose = p;
  }
  if (end == SIZE_MAX) end = loose;
  if (end == SIZE_MAX)
    fail("not a complete zip archive (no end-of-central-directory record; the file is probably truncated)");

  const uint8_t* e = data_ + end;
  uint64_t disk = le16(e + 4), cd_disk = le16(e + 6);
  uint64_t count = le16(e + 10), cd_size = le32(e + 12), cd_offset = le32(e + 16);
  // ZIP64: the locator sits right before the classic record and points at the
  // 64-bit record, whose counts replace the 0xFFFF/0xFFFFFFFF placeholders.
  if (end >= kZip64LocatorSize && le32(data_ + end - kZip64LocatorSize) == kZip64LocatorSig) {
    const uint8_t* loc = data_ + end - kZip64LocatorSize;
    uint64_t rec = le64(loc + 8);
    if (rec > end - kZip64LocatorSize || end - kZip64LocatorSize - rec < kZip64EndSize)
      fail(str("ZIP64 end-of-central-directory locator points at byte ", rec, ", outside the archive"));
    const uint8_t* z = data_ + rec;
    if (le32(z) != kZip64EndSig) fail(str("no ZIP64 end-of-central-directory record at byte ", rec));
    // A classic field that is not the placeholder must agree with its 64-bit
    // twin (torch writes both); a mismatch means the file was damaged.
    auto merge = [&](uint64_t& classic, uint64_t placeholder, uint64_t wide, const char* what) {
      if (classic != placeholder && classic != wide)
        fail(str("zip end records disagree about the ", what, " (", classic, " vs ", wide, "); the file is corrupt"));
      classic = wide;
    };
    disk = le32(z + 16);
    cd_disk = le32(z + 20);
    merge(count, 0xFFFF, le64(z + 32), "entry count");
    merge(cd_size, 0xFFFFFFFF, le64(z + 40), "central directory size");
    merge(cd_offset, 0xFFFFFFFF, le64(z + 48), "central directory offset");
  } else if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    fail("zip archive needs ZIP64 records but has none (the file is probably truncated)");
  }
  if (disk != 0 || cd_disk != 0) fail("multi-part (spanned) zip archives are not supported");
  if (cd_offset > size_ || cd_size > size_ - cd_offset)
    fail(str("zip central directory (", cd_size, " bytes at byte ", cd_offset, ") lies beyond the end of the ", size_,
             "-byte file; the file is truncated or corrupt"));
  if (count > cd_size / kCentralSize)
    fail(str("zip central directory claims ", count, " entries but has room for only ", cd_size / kCentralSize));

  entries_.reserve(static_cast<std::size_t>(count));
  const uint8_t* p = data_ + cd_offset;
  const uint8_t* cd_end = p + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (static_cast<std::size_t>(cd_end - p) < kCentralSize || le32(p) != kCentralSig)
      fail(str("zip central directory entry ", i, " at byte ", p - data_, " is malformed"));
    ZipEntry z;
    z.flags = le16(p + 8);
    z.method = le16(p + 10);
    z.crc32 = le32(p + 16);
    z.stored_size = le32(p + 20);
    z.size = le32(p + 24);
    std::size_t name_len = le16(p + 28), extra_len = le16(p + 30), comment_len = le16(p + 32);
    uint32_t entry_disk = le16(p + 34);
    uint64_t local = le32(p + 42);
    if (static_cast<std::size_t>(cd_end - p) < kCentralSize + name_len + extra_len + comment_len)
      fail(str("zip central directory entry ", i, " runs past the end of the directory"));
    z.name.assign(reinterpret_cast<const char*>(p + kCentralSize), name_len);
    // ZIP64 extended information: the 64-bit values appear only for fields
    // whose 32-bit slot holds the 0xFFFFFFFF placeholder, in this order.
    const uint8_t* x = p + kCentralSize + name_len;
    const uint8_t* x_end = x + extra_len;
    while (x_end - x >= 4) {
      uint16_t id = le16(x), len = le16(x + 2);
      if (x_end - x - 4 < len) fail(str("zip entry '", z.name, "' has a malformed extra field"));
      if (id == 0x0001) {
        const uint8_t* f = x + 4;
        const uint8_t* f_end = f + len;
        auto take = [&](uint64_t& v) {
          if (f_end - f < 8) fail(str("zip entry '", z.name, "' has a short ZIP64 extra field"));
          v = le64(f);
          f += 8;
        };
        if (z.size == 0xFFFFFFFF) take(z.size);
        if (z.stored_size == 0xFFFFFFFF) take(z.stored_size);
        if (local == 0xFFFFFFFF) take(local);
        if (entry_disk == 0xFFFF && f_end - f >= 4) entry_disk = le32(f);
      }
      x += 4 + len;
    }
    if (entry_disk != 0) fail(str("zip entry '", z.name, "' lives on another disk of a spanned archive"));

    // The local header repeats name and extra field, possibly with other
    // lengths; the data starts after the local copy.
    if (local > size_ || size_ - local < kLocalSize || le32(data_ + local) != kLocalSig)
      fail(str("zip entry '", z.name, "' has no local header at byte ", local, "; the file is truncated or corrupt"));
    uint64_t data_offset = local + kLocalSize + le16(data_ + local + 26) + le16(data_ + local + 28);
    if (data_offset > size_ || z.stored_size > size_ - data_offset)
      fail(str("zip entry '", z.name, "' (", z.stored_size, " bytes at byte ", data_offset,
               ") runs past the end of the ", size_, "-byte file; the file is truncated"));
    z.data_offset = data_offset;
    entries_.push_back(std::move(z));
    p += kCentralSize + name_len + extra_len + comment_len;
  }
}

const ZipEntry* ZipReader::find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::string_view ZipReader::read(const ZipEntry& e) const {
  if (e.flags & 1) fail(str("zip entry '", e.name, "' is encrypted"));
  if (e.method != 0)
    fail(str("zip entry '", e.name, "' is compressed (method ", e.method, e.method == 8 ? ", deflate" : "",
             ") but torch.save writes stored entries only, so the archive was repacked by another tool; "
             "re-save it with torch.save or repack it with 'zip -0'"));
  if (e.stored_size != e.size)
    fail(str("zip entry '", e.name, "' is stored but its sizes disagree (", e.stored_size, " vs ", e.size, ")"));
  const uint8_t* p = data_ + e.data_offset;
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  // (The fuzz build, fuzz/CMakeLists.txt, skips this check: a mutated record
  // would otherwise never get past it to the unpickler.)
  if (e.crc32 != 0 && crc32(p, e.size) != e.crc32)
    fail(str("zip entry '", e.name, "' fails its CRC-32 check; the file is corrupt"));
#endif
  return {reinterpret_cast<const char*>(p), static_cast<std::size_t>(e.size)};
}

}  // namespace asap::detail
