// safetensors reading and writing (format: see core/safetensors.h). The checks follow the
// reference implementation (huggingface/safetensors, Rust): the same 100 MB limit on the
// header, the same rule that the tensors tile the data section exactly, and the same header
// padding on write, so files round-trip with PyTorch tooling in both directions.
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this code copies it as it lies in memory");

namespace clustr {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr const char* kMetadataKey = "__metadata__";

// "safetensors: <path>: <what>"
template <typename... Args>
[[noreturn]] void fail(const std::string& path, const Args&... what) {
  throw Error(detail::cat("safetensors: ", path, ": ", what...));
}

std::string errno_text() { return std::strerror(errno); }

// The safetensors name of each of clustr's dtypes, and back.
const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::i32: return "I32";
    case DType::bf16: return "BF16";
  }
  throw Error(detail::cat("safetensors: no safetensors name for dtype ", static_cast<int>(t)));
}

bool parse_dtype(const std::string& s, DType& t) {
  for (DType d : {DType::f32, DType::i32, DType::bf16})
    if (s == dtype_name(d)) {
      t = d;
      return true;
    }
  return false;
}

constexpr const char* kSupported = "F32, BF16 and I32";

// The safetensors dtype names that exist but clustr has no tensor type for.
bool is_known_safetensors_dtype(const std::string& s) {
  static const char* const kKnown[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16",
                                       "U16",  "F16", "U32", "F64",     "I64",     "U64"};
  return std::any_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return s == k; });
}

// ---- reading ----------------------------------------------------------------------------------

// A read-only file descriptor that closes itself.
struct InputFile {
  int fd = -1;
  ~InputFile() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `n` bytes at `offset`; a short read means the file changed under us.
void read_exactly(const std::string& path, int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path, "read failed at byte ", offset, ": ", errno_text());
    if (got == 0)
      fail(path, "file ended at byte ", offset, " while ", n, " more bytes were expected");
    p += got, offset += static_cast<uint64_t>(got), n -= static_cast<uint64_t>(got);
  }
}

// Parses the header, reporting duplicate keys (a JSON parser would silently keep the last one)
// and syntax errors with their byte position.
json parse_header(const std::string& path, const std::string& text) {
  std::vector<std::set<std::string>> keys_per_object;  // one set per object being parsed
  std::vector<std::string> last_key;                   // the key being parsed at each depth
  std::string duplicate;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys_per_object.emplace_back();
        last_key.emplace_back();
        break;
      case json::parse_event_t::object_end:
        keys_per_object.pop_back();
        last_key.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!keys_per_object.back().insert(key).second && duplicate.empty()) {
          duplicate = "'" + key + "'";
          if (last_key.size() >= 2) duplicate += " inside '" + last_key[last_key.size() - 2] + "'";
        }
        last_key.back() = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  // nlohmann stops at a NUL byte as if the input ended there, which would let garbage after it
  // pass; a JSON text never contains one.
  size_t nul = text.find('\0');
  if (nul != std::string::npos)
    fail(path, "header is not valid JSON (a NUL byte at header byte ", nul, ", file offset ",
         8 + nul, ")");
  json header;
  try {
    header = json::parse(text, callback);
  } catch (const json::parse_error& e) {
    // nlohmann counts bytes from 1; report the 0-based index of the offending byte.
    size_t at = e.byte > 0 ? e.byte - 1 : 0;
    fail(path, "header is not valid JSON (at header byte ", at, ", file offset ", 8 + at,
         "): ", e.what());
  } catch (const json::exception& e) {
    fail(path, "header is not valid JSON: ", e.what());
  }
  if (!duplicate.empty()) fail(path, "header has the key ", duplicate, " more than once");
  if (!header.is_object()) fail(path, "header is not a JSON object but a ", header.type_name());
  return header;
}

// One tensor's entry in the header, validated.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // data_offsets
};

uint64_t unsigned_field(const std::string& path, const std::string& name, const char* field,
                        const json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned())
    fail(path, "tensor '", name, "' has a negative value ", v.get<int64_t>(), " in ", field);
  if (!v.is_number_unsigned())
    fail(path, "tensor '", name, "' has ", field, " entry ", v.dump(),
         ", which is not a non-negative integer");
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& path, const std::string& name, const json& j) {
  if (!j.is_object()) fail(path, "header entry '", name, "' is not a JSON object");
  Entry e;
  e.name = name;
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!j.contains(field)) fail(path, "tensor '", name, "' has no \"", field, "\" field");

  const json& dt = j.at("dtype");
  if (!dt.is_string())
    fail(path, "tensor '", name, "' has a dtype that is not a string: ", dt.dump());
  const auto& dts = dt.get_ref<const std::string&>();
  if (!parse_dtype(dts, e.dtype)) {
    if (is_known_safetensors_dtype(dts))
      fail(path, "tensor '", name, "' has dtype ", dts, ", which clustr does not support (only ",
           kSupported, ")");
    fail(path, "tensor '", name, "' has an unknown dtype \"", dts, "\" (clustr reads ",
         kSupported, ")");
  }

  const json& sh = j.at("shape");
  if (!sh.is_array())
    fail(path, "tensor '", name, "' has a shape that is not an array: ", sh.dump());
  uint64_t count = 1;
  bool overflow = false;
  for (const json& d : sh) {
    if (d.is_number_integer() && !d.is_number_unsigned())
      fail(path, "tensor '", name, "' has a negative dimension ", d.get<int64_t>(), " in shape ",
           sh.dump());
    uint64_t n = unsigned_field(path, name, "shape", d);
    if (n > static_cast<uint64_t>(INT64_MAX)) overflow = true;
    overflow = overflow || __builtin_mul_overflow(count, n, &count);
    e.shape.push_back(static_cast<int64_t>(n));
  }
  uint64_t bytes = 0;
  overflow = overflow || __builtin_mul_overflow(count, dtype_size(e.dtype), &bytes) ||
             bytes > static_cast<uint64_t>(INT64_MAX);
  // A shape whose byte size overflows can be covered by no file, so it is reported as such.
  if (overflow) fail(path, "tensor '", name, "' has shape ", sh.dump(), ", too large for any file");

  const json& off = j.at("data_offsets");
  if (!off.is_array() || off.size() != 2)
    fail(path, "tensor '", name, "' has data_offsets ", off.dump(), "; expected [begin, end]");
  e.begin = unsigned_field(path, name, "data_offsets", off[0]);
  e.end = unsigned_field(path, name, "data_offsets", off[1]);
  if (e.end < e.begin)
    fail(path, "tensor '", name, "' has data_offsets [", e.begin, ", ", e.end,
         "] that end before they begin");
  if (e.end - e.begin != bytes) {
    const uint64_t span = e.end - e.begin, size = dtype_size(e.dtype);
    fail(path, "tensor '", name, "' has data_offsets [", e.begin, ", ", e.end, "] spanning ", span,
         " bytes", span % size != 0 ? detail::cat(" (not a whole number of ", size, "-byte ", dts,
                                                 " elements)")
                                    : std::string(),
         ", but ", dts, " shape ", to_string(e.shape), " needs ", bytes);
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& j) {
  std::map<std::string, std::string> out;
  if (j.is_null()) return out;
  if (!j.is_object())
    fail(path, "\"", kMetadataKey, "\" is not a JSON object of strings: ", j.dump());
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      fail(path, "metadata value of '", key, "' is not a string: ", value.dump());
    out[key] = value.get<std::string>();
  }
  return out;
}

// ---- writing ----------------------------------------------------------------------------------

// The temporary file of an atomic write: removed unless commit() succeeded.
class TempFile {
 public:
  explicit TempFile(const std::string& target) : target_(target) {
    // pid + a per-process counter make the name unique among concurrent writers; O_EXCL makes
    // sure we never write into someone else's file.
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
      path_ = detail::cat(target, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) fail(target_, "cannot create the temporary file ", path_, ": ", errno_text());
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t put = ::write(fd_, p, n);
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) fail(target_, "writing ", path_, " failed: ", errno_text());
      p += put, n -= static_cast<size_t>(put);
    }
  }

  // fsync, close, rename over the target, then fsync the directory so the rename itself is
  // durable.
  void commit() {
    if (::fsync(fd_) != 0) fail(target_, "fsync of ", path_, " failed: ", errno_text());
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(target_, "closing ", path_, " failed: ", errno_text());
    if (::rename(path_.c_str(), target_.c_str()) != 0)
      fail(target_, "renaming ", path_, " to it failed: ", errno_text());
    committed_ = true;
    size_t slash = target_.find_last_of('/');
    std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : target_.substr(0, slash));
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      // Best effort: some file systems refuse fsync on a directory, and the file is already
      // complete and in place, so a failure here is no reason to report the save as failed.
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

const Tensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    std::string have;
    for (const auto& kv : tensors) have += (have.empty() ? "" : ", ") + kv.first;
    fail(path, "no tensor named '", name, "' (the file has: ", have.empty() ? "none" : have, ")");
  }
  return it->second;
}

const std::string& SafetensorsFile::meta(const std::string& key) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) {
    std::string have;
    for (const auto& kv : metadata) have += (have.empty() ? "" : ", ") + kv.first;
    fail(path, "no metadata key '", key, "' (the file has: ", have.empty() ? "none" : have, ")");
  }
  return it->second;
}

SafetensorsFile load_safetensors(const std::string& path) {
  InputFile in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in.fd < 0) fail(path, "cannot open: ", errno_text());
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) fail(path, "cannot stat: ", errno_text());
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);

  if (file_size < 8)
    fail(path, "file has ", file_size, " bytes, fewer than the 8-byte header length");
  unsigned char len_bytes[8];
  read_exactly(path, in.fd, len_bytes, 8, 0);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    fail(path, "header length ", header_len, " is larger than the ", kMaxHeaderBytes,
         "-byte limit (not a safetensors file?)");
  if (header_len > file_size - 8)
    fail(path, "header length ", header_len, " runs past the end of the file (", file_size,
         " bytes)");
  if (header_len == 0) fail(path, "header length is 0; expected a JSON object");

  std::string text(header_len, '\0');
  read_exactly(path, in.fd, text.data(), header_len, 8);
  json header = parse_header(path, text);

  SafetensorsFile out;
  out.path = path;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey)
      out.metadata = parse_metadata(path, value);
    else
      entries.push_back(parse_entry(path, name, value));
  }

  // The tensors must tile the data section: sorted by offset, each begins where the previous
  // one ended, and the last one ends at the end of the file.
  const uint64_t data_start = 8 + header_len, data_size = file_size - data_start;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.end > data_size)
      fail(path, "tensor '", e.name, "' has data_offsets [", e.begin, ", ", e.end,
           "] past the end of the data section (", data_size, " bytes)");
    if (e.begin < covered)
      fail(path, "tensors '", previous->name, "' and '", e.name, "' overlap in the data section (",
           "bytes [", e.begin, ", ", covered, "))");
    if (e.begin > covered)
      fail(path, "bytes [", covered, ", ", e.begin, ") of the data section belong to no tensor ",
           "(the next tensor is '", e.name, "')");
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size)
    fail(path, "the data section has ", data_size, " bytes but the tensors cover only ", covered,
         " (trailing bytes after the last tensor)");

  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu);
    if (t.nbytes() > 0) read_exactly(path, in.fd, t.raw(), t.nbytes(), data_start + e.begin);
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Host copies (a no-op for cpu tensors, which are shared, not copied).
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  std::set<std::string> names;
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) fail(path, "cannot save a tensor with an empty name");
    if (name == kMetadataKey)
      fail(path, "cannot save a tensor named \"", kMetadataKey, "\" (reserved)");
    if (!names.insert(name).second) fail(path, "cannot save two tensors named '", name, "'");
    if (!t.defined()) fail(path, "cannot save tensor '", name, "': it is undefined");
    host.push_back(t.device() == Device::cpu ? t : t.to(Device::cpu));
    uint64_t n = t.nbytes();
    header[name] = {{"dtype", dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    fail(path, "a tensor name or metadata string is not valid UTF-8: ", e.what());
  }
  // Padded with spaces so the data section starts 8-byte aligned, as the reference writes it.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i)
    len_bytes[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  TempFile tmp(path);
  tmp.write(len_bytes, 8);
  tmp.write(text.data(), text.size());
  for (const Tensor& t : host)
    if (t.nbytes() > 0) tmp.write(t.raw(), t.nbytes());
  tmp.commit();
}

}  // namespace clustr
