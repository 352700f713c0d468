// Tests for the checkpoint reader: fixtures written by
// tests/data/checkpoint/make_checkpoint_fixtures.py (torch 1.13) with expected
// values in expected.json, hand-built archives and pickles, and one test case
// per rejected input asserting the error text.
#include <ATen/ATen.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "asap/checkpoint.h"
#include "asap/error.h"
#include "checkpoint/unpickler.h"
#include "checkpoint/zip_reader.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using asap::Checkpoint;
using asap::load_checkpoint;

std::string fixture(const std::string& name) { return asap_test::data_path("checkpoint/" + name); }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file in the temp directory, removed when the test ends.
struct TempFile {
  std::string path;
  TempFile(const std::string& name, const std::string& bytes)
      : path((fs::temp_directory_path() / ("asap_ckpt_" + std::to_string(::getpid()) + "_" + name)).string()) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

// The asap::Error text load_checkpoint throws for `path` ("" if none).
std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const asap::Error& e) {
    return e.what();
  }
  return "";
}

#define CHECK_HAS(text, part) \
  CHECK_MESSAGE((text).find(part) != std::string::npos, "'" << (text) << "' lacks '" << (part) << "'")

// --- little-endian writers for hand-built archives and pickles ---
void put16(std::string& s, uint16_t v) { s += char(v & 0xff), s += char(v >> 8); }
void put32(std::string& s, uint32_t v) { put16(s, v & 0xffff), put16(s, v >> 16); }
void put64(std::string& s, uint64_t v) { put32(s, uint32_t(v)), put32(s, uint32_t(v >> 32)); }

struct Record {
  std::string name, data;
};

// A stored ZIP the way torch.save lays it out; zip64 forces the ZIP64
// end records and extra fields that torch writes for files over 4 GiB.
std::string make_zip(const std::vector<Record>& recs, bool zip64 = false) {
  std::string out, cd;
  for (const auto& r : recs) {
    const uint64_t offset = out.size();
    const uint32_t crc = asap::detail::crc32(r.data.data(), r.data.size());
    put32(out, 0x04034b50), put16(out, zip64 ? 45 : 20), put16(out, 0), put16(out, 0), put32(out, 0);
    put32(out, crc), put32(out, uint32_t(r.data.size())), put32(out, uint32_t(r.data.size()));
    put16(out, uint16_t(r.name.size())), put16(out, 0);
    out += r.name + r.data;
    put32(cd, 0x02014b50), put16(cd, 45), put16(cd, zip64 ? 45 : 20), put16(cd, 0), put16(cd, 0), put32(cd, 0);
    put32(cd, crc);
    put32(cd, zip64 ? 0xFFFFFFFF : uint32_t(r.data.size())), put32(cd, zip64 ? 0xFFFFFFFF : uint32_t(r.data.size()));
    put16(cd, uint16_t(r.name.size())), put16(cd, zip64 ? 28 : 0), put16(cd, 0), put16(cd, 0), put16(cd, 0);
    put32(cd, 0), put32(cd, zip64 ? 0xFFFFFFFF : uint32_t(offset));
    cd += r.name;
    if (zip64) put16(cd, 1), put16(cd, 24), put64(cd, r.data.size()), put64(cd, r.data.size()), put64(cd, offset);
  }
  const uint64_t cd_offset = out.size();
  out += cd;
  if (zip64) {
    const uint64_t rec = out.size();
    put32(out, 0x06064b50), put64(out, 44), put16(out, 45), put16(out, 45), put32(out, 0), put32(out, 0);
    put64(out, recs.size()), put64(out, recs.size()), put64(out, cd.size()), put64(out, cd_offset);
    put32(out, 0x07064b50), put32(out, 0), put64(out, rec), put32(out, 1);
  }
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0);
  put16(out, zip64 ? 0xFFFF : uint16_t(recs.size())), put16(out, zip64 ? 0xFFFF : uint16_t(recs.size()));
  put32(out, zip64 ? 0xFFFFFFFF : uint32_t(cd.size())), put32(out, zip64 ? 0xFFFFFFFF : uint32_t(cd_offset));
  put16(out, 0);
  return out;
}

// All records of a fixture archive, optionally with one replaced.
std::vector<Record> records_of(const std::string& bytes) {
  asap::detail::ZipReader zip(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "fixture");
  std::vector<Record> out;
  for (const auto& e : zip.entries()) out.push_back({e.name, std::string(zip.read(e))});
  return out;
}

// Pickle fragments (protocol 2 opcodes).
std::string uni(const std::string& s) {
  std::string out = "X";
  put32(out, uint32_t(s.size()));
  return out + s;
}
std::string glob(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }
std::string k1(int v) { return std::string("K") + char(v); }

// OrderedDict{'w': _rebuild_tensor_v2(storage '0' of `numel` floats, offset, sizes, strides)}.
std::string tensor_pickle(int numel, int offset, std::vector<int> sizes, std::vector<int> strides,
                          const std::string& storage_type = "FloatStorage") {
  std::string p = "\x80\x02" + glob("collections", "OrderedDict") + ")R(" + uni("w") +
                  glob("torch._utils", "_rebuild_tensor_v2") + "((" + uni("storage") + glob("torch", storage_type) +
                  uni("0") + uni("cpu") + k1(numel) + "tQ" + k1(offset) + "(";
  for (int s : sizes) p += k1(s);
  p += "t(";
  for (int s : strides) p += k1(s);
  return p + "t\x89)tRu.";
}

std::string floats(std::vector<float> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

// --- expected.json comparison ---
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return "other";
  }
}

Checkpoint check_fixture(const std::string& file) {
  const auto expected = asap_test::load_json("checkpoint/expected.json").at(file);
  Checkpoint ck = load_checkpoint(fixture(file));
  CHECK(ck.path == fixture(file));
  CHECK(ck.kind == expected.at("kind").get<std::string>());
  CHECK(ck.stripped_prefix == expected.at("stripped_prefix").get<std::string>());
  CHECK(ck.sha256 == expected.at("sha256").get<std::string>());
  const auto& tensors = expected.at("tensors");
  REQUIRE(ck.names.size() == tensors.size());
  CHECK(ck.tensors.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& want = tensors[i];
    const std::string name = want.at("name");
    INFO(file << ": tensor " << name);
    CHECK(ck.names[i] == name);
    REQUIRE(ck.has(name));
    const at::Tensor& t = ck.get(name);
    CHECK(t.device().is_cpu());
    CHECK(t.is_contiguous());
    CHECK_FALSE(t.requires_grad());
    CHECK(dtype_name(t.scalar_type()) == want.at("dtype").get<std::string>());
    CHECK(t.sizes().vec() == want.at("shape").get<std::vector<int64_t>>());
    at::Tensor flat = t.reshape(-1).to(at::kDouble);
    const double sum = want.at("sum");
    CHECK(flat.sum().item<double>() == doctest::Approx(sum).epsilon(1e-9));
    const auto first = want.at("first").get<std::vector<double>>();
    REQUIRE(flat.numel() >= static_cast<int64_t>(first.size()));
    for (std::size_t k = 0; k < first.size(); ++k) CHECK(flat[int64_t(k)].item<double>() == first[k]);
  }
  return ck;
}

}  // namespace

// ---------------------------------------------------------------- accepted

TEST_CASE("checkpoint: plain state_dict with every dtype and an nn.Parameter") {
  Checkpoint ck = check_fixture("state_dict.pt");
  CHECK(ck.sha256 == asap::sha256_file(fixture("state_dict.pt")));
  CHECK(ck.get("idx_i64")[1][0].item<int64_t>() == (int64_t(1) << 40));  // exact, not via double
  CHECK((ck.get("mask_bool").scalar_type() == at::kBool));
  CHECK(ck.get("scalar").dim() == 0);
  CHECK(ck.get("empty").numel() == 0);
}

TEST_CASE("checkpoint: pickle protocol 4 state_dict") {
  Checkpoint a = check_fixture("state_dict_p4.pt");
  Checkpoint b = load_checkpoint(fixture("state_dict.pt"));
  for (const auto& name : b.names) CHECK(a.get(name).equal(b.get(name)));
}

TEST_CASE("checkpoint: views into one shared storage keep offset and stride") {
  Checkpoint ck = check_fixture("views.pt");
  at::Tensor base = at::arange(12, at::kFloat);
  CHECK(ck.get("head").equal(base.slice(0, 0, 5)));
  CHECK(ck.get("tail").equal(base.slice(0, 5)));
  CHECK(ck.get("transposed").equal(base.view({3, 4}).t().contiguous()));
  CHECK(ck.get("every_other").equal(base.slice(0, 1, 12, 2)));
  CHECK(ck.get("tied").equal(base));
  // A slice gets its own compact storage instead of pinning the shared one.
  CHECK(ck.get("tail").storage_offset() == 0);
  CHECK(ck.get("tail").storage().nbytes() == 7 * sizeof(float));
}

TEST_CASE("checkpoint: training checkpoint dict with model_state_dict") {
  Checkpoint ck = check_fixture("checkpoint_dict.pt");
  // The optimizer's exp_avg tensors are not mistaken for weights.
  CHECK(ck.names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
}

TEST_CASE("checkpoint: the single nested tensor dict under an unusual key") { check_fixture("nested_dict.pt"); }

TEST_CASE("checkpoint: DataParallel 'module.' prefix is stripped") {
  Checkpoint ck = check_fixture("dataparallel.pt");
  CHECK(ck.has("0.weight"));
  CHECK_FALSE(ck.has("module.0.weight"));
}

TEST_CASE("checkpoint: whole pickled nn.Module of custom classes") {
  Checkpoint ck = check_fixture("module.pt");
  CHECK(ck.has("blocks.0.proj.weight"));
  CHECK(ck.has("blocks.2.scale"));            // persistent buffer
  CHECK_FALSE(ck.has("blocks.0.cache"));      // non-persistent buffer
  CHECK_FALSE(ck.has("blocks.0.proj.bias"));  // bias=False registers None
  CHECK_FALSE(ck.has("unused"));              // None buffer
  CHECK(ck.get("steps").item<int64_t>() == 7);
}

TEST_CASE("checkpoint: whole module inside a checkpoint dict") { check_fixture("checkpoint_module.pt"); }

TEST_CASE("checkpoint: safetensors file") {
  Checkpoint ck = check_fixture("tensors.safetensors");
  CHECK(ck.names.front() == "a.weight");  // data order, not JSON key order
}

TEST_CASE("checkpoint: ZIP64 archive with another top folder name") {
  Checkpoint want = load_checkpoint(fixture("state_dict.pt"));
  std::vector<Record> recs = records_of(read_bytes(fixture("state_dict.pt")));
  for (auto& r : recs) r.name = "renamed_folder" + r.name.substr(r.name.find('/'));
  TempFile f("zip64.pt", make_zip(recs, true));
  Checkpoint got = load_checkpoint(f.path);
  CHECK(got.kind == "state_dict");
  REQUIRE(got.names == want.names);
  for (const auto& name : want.names) CHECK(got.get(name).equal(want.get(name)));
}

TEST_CASE("checkpoint: hand-written pickle with a column-major view") {
  TempFile f("colmajor.pt",
             make_zip({{"x/data.pkl", tensor_pickle(6, 0, {2, 3}, {1, 2})}, {"x/data/0", floats({0, 1, 2, 3, 4, 5})}}));
  Checkpoint ck = load_checkpoint(f.path);
  at::Tensor want = at::tensor({0.f, 2.f, 4.f, 1.f, 3.f, 5.f}).view({2, 3});
  CHECK(ck.get("w").equal(want));
  CHECK(ck.get("w").is_contiguous());
}

TEST_CASE("checkpoint unpickler: protocol 0 text opcodes") {
  using K = asap::detail::Value::Kind;
  const std::string p = "(lp0\nI1\naI01\naF1.5\naS'a\\'b'\np1\naL12345678901234567890L\nag1\na(dp2\nVk\\u00e9\nI7\nsa.";
  asap::detail::Pickle pk = asap::detail::unpickle(p, "test");
  const auto& items = pk.root->items;
  REQUIRE(pk.root->kind == K::List);
  REQUIRE(items.size() == 7);
  CHECK((items[0]->kind == K::Int && items[0]->i == 1));
  CHECK((items[1]->kind == K::Bool && items[1]->b));
  CHECK((items[2]->kind == K::Float && items[2]->f == 1.5));
  CHECK((items[3]->kind == K::Str && items[3]->s == "a'b"));
  CHECK(items[4]->kind == K::BigInt);
  CHECK(items[5] == items[3]);  // memo GET returns the same object
  REQUIRE(items[6]->kind == K::Dict);
  REQUIRE(items[6]->get("k\xc3\xa9"));
  CHECK(items[6]->get("k\xc3\xa9")->i == 7);
}

TEST_CASE("checkpoint unpickler: protocol 4 sets, bytes, longs and stack opcodes") {
  using K = asap::detail::Value::Kind;
  std::string p =
      "\x80\x04](\x8f(K\x01K\x02K\x01\x90(K\x03\x91"
      "C\x02hi";
  p += std::string("\x8a\x02\x00\xff", 4) + "G";
  p += std::string("\x40\x0c\x00\x00\x00\x00\x00\x00", 8);
  p += "K\x09"
       "0"
       "(K\x01K\x02"
       "1"
       "N2e.";
  asap::detail::Pickle pk = asap::detail::unpickle(p, "test");
  REQUIRE(pk.root->kind == K::List);
  const auto& it = pk.root->items;
  REQUIRE(it.size() == 7);
  CHECK((it[0]->kind == K::Set && it[0]->items.size() == 2 && !it[0]->b));
  CHECK((it[1]->kind == K::Set && it[1]->items.size() == 1 && it[1]->b));
  CHECK((it[2]->kind == K::Bytes && it[2]->s == "hi"));
  CHECK((it[3]->kind == K::Int && it[3]->i == -256));
  CHECK((it[4]->kind == K::Float && it[4]->f == 3.5));
  CHECK((it[5]->kind == K::None && it[6] == it[5]));
  CHECK(pk.protocol == 4);
}

TEST_CASE("checkpoint: unknown classes load as inert objects") {
  using K = asap::detail::Value::Kind;
  // os.system('echo pwned') must stay an inert object, never run.
  std::string p = "\x80\x02" + glob("os", "system") + uni("echo pwned") + "\x85R" + "}" + uni("a") + k1(1) + "sb.";
  asap::detail::Pickle pk = asap::detail::unpickle(p, "test");
  REQUIRE(pk.root->kind == K::Object);
  CHECK(pk.root->s == "os.system");
  REQUIRE(pk.root->items.size() == 1);
  CHECK(pk.root->items[0]->s == "echo pwned");
  REQUIRE(pk.root->state);
  CHECK(pk.root->state->get("a")->i == 1);
}

TEST_CASE("checkpoint: sha256 matches known digests") {
  CHECK(asap::sha256_hex("", 0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(asap::sha256_hex("abc", 3) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(asap::sha256_hex(two_blocks.data(), two_blocks.size()) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  TempFile f("million_a.bin", million);
  CHECK(asap::sha256_file(f.path) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  CHECK(asap::sha256_hex(million.data(), million.size()) == asap::sha256_file(f.path));
}

TEST_CASE("checkpoint: get() names the file and suggests close names") {
  Checkpoint ck = load_checkpoint(fixture("module.pt"));
  std::string msg;
  try {
    ck.get("embed.wieght");
  } catch (const asap::Error& e) {
    msg = e.what();
  }
  CHECK_HAS(msg, "checkpoint '" + fixture("module.pt") + "' has no tensor 'embed.wieght'");
  CHECK_HAS(msg, "did you mean 'embed.weight'");
  try {
    ck.get("zzz");
  } catch (const asap::Error& e) {
    msg = e.what();
  }
  CHECK_HAS(msg, "has no tensor 'zzz' (it holds ");
}

// ---------------------------------------------------------------- rejected

TEST_CASE("checkpoint rejects a missing file") {
  std::string msg = load_error("/nonexistent/model.pt");
  CHECK_HAS(msg, "cannot open checkpoint '/nonexistent/model.pt': No such file");
}

TEST_CASE("checkpoint rejects an empty file") {
  TempFile f("empty.pt", "");
  CHECK_HAS(load_error(f.path), "checkpoint '" + f.path + "' is empty");
}

TEST_CASE("checkpoint rejects a zip cut in half") {
  std::string bytes = read_bytes(fixture("state_dict.pt"));
  TempFile f("half.pt", bytes.substr(0, bytes.size() / 2));
  std::string msg = load_error(f.path);
  CHECK_HAS(msg, "checkpoint '" + f.path + "': not a complete zip archive");
  CHECK_HAS(msg, "truncated");
}

TEST_CASE("checkpoint rejects a zip whose central directory lies past the end") {
  std::string bytes = make_zip(records_of(read_bytes(fixture("state_dict.pt"))));
  bytes[bytes.size() - 22 + 16 + 3] = '\x7f';  // EOCD central-directory offset, high byte
  TempFile f("cdoff.pt", bytes);
  std::string msg = load_error(f.path);
  CHECK_HAS(msg, "checkpoint '" + f.path + "': zip central directory (");
  CHECK_HAS(msg, "lies beyond the end of the " + std::to_string(bytes.size()) + "-byte file");
}

TEST_CASE("checkpoint rejects zip end records that disagree") {
  std::string bytes = read_bytes(fixture("state_dict.pt"));  // torch writes ZIP64 records too
  bytes[bytes.size() - 22 + 16] ^= 0x01;                     // classic central-directory offset
  TempFile f("disagree.pt", bytes);
  CHECK_HAS(load_error(f.path), "zip end records disagree about the central directory offset");
}

TEST_CASE("checkpoint rejects a truncated data.pkl") {
  std::vector<Record> recs = records_of(read_bytes(fixture("state_dict.pt")));
  recs[0].data.resize(recs[0].data.size() / 2);  // data.pkl is the first record
  TempFile f("badpkl.pt", make_zip(recs));
  std::string msg = load_error(f.path);
  CHECK_HAS(msg, "checkpoint '" + f.path + "': data.pkl: pickle data ends");
}

TEST_CASE("checkpoint rejects an unsupported pickle opcode") {
  TempFile f("opcode.pt", make_zip({{"a/data.pkl", "\x80\x02}\xff."}}));
  CHECK(load_error(f.path) == "checkpoint '" + f.path + "': data.pkl: unsupported pickle opcode 0xff at byte 3");
  TempFile g("ext1.pt", make_zip({{"a/data.pkl", "\x80\x02\x82\x01."}}));
  CHECK_HAS(load_error(g.path), "data.pkl: unsupported pickle opcode 0x82 (EXT1) at byte 2");
}

TEST_CASE("checkpoint rejects a pickle stack underflow") {
  TempFile f("underflow.pt", make_zip({{"a/data.pkl", "\x80\x02R."}}));
  CHECK_HAS(load_error(f.path), "data.pkl: pickle stack underflow at byte 2");
}

TEST_CASE("checkpoint rejects a missing memo entry") {
  TempFile f("memo.pt", make_zip({{"a/data.pkl", "\x80\x02h\x05."}}));
  CHECK_HAS(load_error(f.path), "data.pkl: pickle memo has no entry 5 at byte 2");
}

TEST_CASE("checkpoint rejects a corrupt string length without allocating it") {
  std::string p = "\x80\x02X";
  put32(p, 0xFFFFFFF0u);
  TempFile f("strlen.pt", make_zip({{"a/data.pkl", p + "abc."}}));
  CHECK_HAS(load_error(f.path), "data.pkl: pickle data ends early (needs 4294967280 more bytes, 4 left");
}

TEST_CASE("checkpoint rejects the legacy torch.save format") {
  const std::string path = fixture("legacy.pt");
  std::string msg = load_error(path);
  CHECK_HAS(msg, "checkpoint '" + path + "' uses the legacy (pre-1.6) torch.save format");
  CHECK_HAS(msg, "python3 -c \"import torch; torch.save(torch.load('" + path + "', map_location='cpu'), '" + path +
                     ".new')\"");
}

TEST_CASE("checkpoint rejects a compressed zip entry") {
  std::string msg = load_error(fixture("compressed.pt"));
  CHECK_HAS(msg, "checkpoint '" + fixture("compressed.pt") +
                     "': zip entry 'state_dict/data.pkl' is compressed (method 8, deflate)");
}

TEST_CASE("checkpoint rejects a record that fails its CRC") {
  std::vector<Record> recs = records_of(read_bytes(fixture("state_dict.pt")));
  std::string zip = make_zip(recs);
  const std::size_t at = zip.find(recs[1].data);  // the first storage record
  REQUIRE(at != std::string::npos);
  zip[at] ^= 0x40;
  TempFile f("crc.pt", zip);
  CHECK_HAS(load_error(f.path), "zip entry '" + recs[1].name + "' fails its CRC-32 check");
}

TEST_CASE("checkpoint rejects a safetensors header length beyond the file") {
  std::string bytes = read_bytes(fixture("tensors.safetensors"));
  bytes[5] = '\x01';  // header length now ~2^40
  TempFile f("long.safetensors", bytes);
  std::string msg = load_error(f.path);
  CHECK_HAS(msg, "checkpoint '" + f.path + "': safetensors header length ");
  CHECK_HAS(msg, "runs past the end of the " + std::to_string(bytes.size()) + "-byte file");
}

TEST_CASE("checkpoint rejects safetensors offsets that disagree with the shape") {
  std::string header = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})";
  std::string bytes;
  put64(bytes, header.size());
  TempFile f("short.safetensors", bytes + header + std::string(16, '\0'));
  CHECK_HAS(load_error(f.path), "safetensors tensor 'w' has 16 bytes of data but its shape and dtype need 24");
}

TEST_CASE("checkpoint rejects an unsupported safetensors dtype") {
  std::string header = R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})";
  std::string bytes;
  put64(bytes, header.size());
  TempFile f("c64.safetensors", bytes + header + std::string(8, '\0'));
  CHECK_HAS(load_error(f.path), "safetensors tensor 'w' has unsupported dtype \"C64\"");
}

TEST_CASE("checkpoint rejects a storage record smaller than its persistent id says") {
  TempFile f("smallrec.pt",
             make_zip({{"a/data.pkl", tensor_pickle(6, 0, {2, 3}, {3, 1})}, {"a/data/0", floats({0, 1, 2, 3})}}));
  CHECK_HAS(load_error(f.path), "checkpoint '" + f.path +
                                    "': storage record 'a/data/0' holds 16 bytes but tensor 'w' says it has 6 float32 "
                                    "elements");
}

TEST_CASE("checkpoint rejects a tensor whose size and stride reach past its storage") {
  TempFile f("extent.pt",
             make_zip({{"a/data.pkl", tensor_pickle(4, 1, {2, 2}, {2, 1})}, {"a/data/0", floats({0, 1, 2, 3})}}));
  CHECK_HAS(load_error(f.path), "checkpoint '" + f.path +
                                    "': tensor 'w' (shape [2, 2], stride [2, 1], offset 1) reaches past the end of "
                                    "its storage 'a/data/0', which holds only 4 float32 elements");
}

TEST_CASE("checkpoint rejects a missing storage record") {
  TempFile f("norec.pt", make_zip({{"a/data.pkl", tensor_pickle(4, 0, {2, 2}, {2, 1})}}));
  CHECK_HAS(load_error(f.path), "tensor 'w' refers to storage record 'a/data/0', which is missing");
}

TEST_CASE("checkpoint rejects an unsupported storage dtype") {
  TempFile f("complex.pt", make_zip({{"a/data.pkl", tensor_pickle(2, 0, {2}, {1}, "ComplexFloatStorage")},
                                     {"a/data/0", floats({0, 1, 2, 3})}}));
  CHECK_HAS(load_error(f.path),
            "checkpoint '" + f.path + "': data.pkl: unsupported storage type torch.ComplexFloatStorage");
}

TEST_CASE("checkpoint rejects quantized and other special tensors") {
  std::string p = "\x80\x02}" + uni("w") + glob("torch._utils", "_rebuild_qtensor") + ")Rs.";
  TempFile f("qtensor.pt", make_zip({{"a/data.pkl", p}}));
  CHECK_HAS(load_error(f.path), "data.pkl: unsupported tensor kind torch._utils._rebuild_qtensor");
}

TEST_CASE("checkpoint rejects a storage pickled with torch.storage._load_from_bytes") {
  std::string p = "\x80\x02}" + uni("w") + glob("torch.storage", "_load_from_bytes") + "C\x01x\x85Rs.";
  TempFile f("frombytes.pt", make_zip({{"a/data.pkl", p}}));
  CHECK_HAS(load_error(f.path), "data.pkl: torch.storage._load_from_bytes");
  CHECK_HAS(load_error(f.path), "is not supported at byte ");
}

TEST_CASE("checkpoint rejects a file that is neither zip nor safetensors") {
  TempFile f("text.pt", "hello world, not a model");
  CHECK(load_error(f.path) == "checkpoint '" + f.path +
                                  "' is not a PyTorch zip checkpoint or safetensors file (starts with bytes 68 65 6c "
                                  "6c 6f 20 77 6f)");
}

TEST_CASE("checkpoint rejects a checkpoint without tensors") {
  CHECK(load_error(fixture("no_tensors.pt")) ==
        "no tensors found in checkpoint '" + fixture("no_tensors.pt") + "': top-level object is a list of 3");
}

TEST_CASE("checkpoint rejects a dict holding several state dicts") {
  std::string sd = glob("collections", "OrderedDict") + ")R(" + uni("w") + glob("torch._utils", "_rebuild_tensor_v2") +
                   "((" + uni("storage") + glob("torch", "FloatStorage") + uni("0") + uni("cpu") + k1(1) + "tQ" +
                   k1(0) + ")" + ")" + "\x89)tRu";
  std::string p = std::string("\x80\x02}q\x00(", 6) + uni("gen") + sd + "q\x01" + uni("disc") + "h\x01" + "u.";
  TempFile f("two.pt", make_zip({{"a/data.pkl", p}, {"a/data/0", floats({1})}}));
  std::string msg = load_error(f.path);
  CHECK_HAS(msg, "checkpoint '" + f.path + "' holds several state dicts (under 'gen', 'disc')");
}

TEST_CASE("checkpoint rejects a TorchScript archive") {
  TempFile f("script.pt", make_zip({{"m/data.pkl", "\x80\x02}."}, {"m/constants.pkl", "\x80\x02)."}}));
  CHECK_HAS(load_error(f.path), "checkpoint '" + f.path + "' is a TorchScript archive (torch.jit.save)");
}

TEST_CASE("checkpoint: random corruption gives asap::Error, never a crash") {
  // Mutated data.pkl records are re-zipped with fresh CRCs so the pickle VM,
  // not the CRC check, sees the damage; safetensors headers are mutated in place.
  std::mt19937 rng(1234);
  auto mutate = [&](std::string s) {
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const std::size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = char(rng());
          break;
        case 1:
          s.erase(at, 1 + rng() % 8);
          break;
        case 2:
          s.insert(at, 1, char(rng()));
          break;
        default:
          s.resize(at);
          break;
      }
    }
    return s;
  };
  int loaded = 0, rejected = 0;
  for (const char* name : {"state_dict.pt", "views.pt", "module.pt", "checkpoint_dict.pt", "state_dict_p4.pt"}) {
    const std::vector<Record> recs = records_of(read_bytes(fixture(name)));
    for (int trial = 0; trial < 150; ++trial) {
      std::vector<Record> bad = recs;
      bad[0].data = mutate(bad[0].data);
      TempFile f("fuzz.pt", make_zip(bad));
      try {
        load_checkpoint(f.path);
        ++loaded;
      } catch (const asap::Error&) {
        ++rejected;
      }
    }
  }
  const std::string st = read_bytes(fixture("tensors.safetensors"));
  for (int trial = 0; trial < 300; ++trial) {
    std::string bad = st.substr(0, 8) + mutate(st.substr(8));
    TempFile f("fuzz.safetensors", bad);
    try {
      load_checkpoint(f.path);
      ++loaded;
    } catch (const asap::Error&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
  MESSAGE("fuzz: " << loaded << " loaded, " << rejected << " rejected");
}
