// ImageDataset: where each sample's bytes are. torchvision's ImageFolder walk, and an index of
// WebDataset tar shards built from one pass over their headers.
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "ddp/image_data.h"
#include "ddp/launch_env.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool isImageExtension(const std::string& ext) { return ext == "jpg" || ext == "jpeg" || ext == "png"; }

// One sample: a file (offset 0, size -1: the whole file) or a tar member.
struct Entry {
  int32_t file = 0;
  int64_t offset = 0;
  int64_t size = -1;
  int64_t label = 0;
  std::string member;  // tar: the member's path
};

class Fd {
 public:
  // O_NONBLOCK: a named pipe is refused (not a regular file) instead of blocking the open until
  // something writes to it; no effect on a regular file.
  explicit Fd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// pread until `size` bytes or the end of the file; returns the bytes read.
int64_t readAt(int fd, uint8_t* out, int64_t size, int64_t offset) {
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, static_cast<size_t>(size - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? -1 : done;
    done += n;
  }
  return done;
}

// --- tar -------------------------------------------------------------------------------------------

constexpr int64_t kBlock = 512;

int64_t octalField(const uint8_t* p, size_t n, bool* ok) {
  if (p[0] & 0x80) {  // GNU base-256 for sizes >= 8 GiB
    int64_t v = p[0] & 0x7F;
    for (size_t i = 1; i < n; ++i) v = (v << 8) | p[i];
    return v;
  }
  int64_t v = 0;
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == 0)) ++i;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) v = v * 8 + (p[i] - '0');
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != 0) *ok = false;
  }
  return v;
}

std::string cString(const uint8_t* p, size_t n) {
  const auto* end = static_cast<const uint8_t*>(std::memchr(p, 0, n));
  return {reinterpret_cast<const char*>(p), end != nullptr ? static_cast<size_t>(end - p) : n};
}

// The header's sum with the checksum field as spaces; some old tars summed signed chars (Python's
// tarfile accepts both).
bool checksumOk(const uint8_t* h) {
  bool ok = true;
  const int64_t stored = octalField(h + 148, 8, &ok);
  int64_t sum = 0, signedSum = 0;
  for (int64_t i = 0; i < kBlock; ++i) {
    const uint8_t b = (i >= 148 && i < 156) ? ' ' : h[i];
    sum += b;
    signedSum += static_cast<int8_t>(b);
  }
  return ok && (stored == sum || stored == signedSum);
}

// pax records "len key=value\n": the path, if one is given.
std::string paxPath(const std::string& records) {
  size_t pos = 0;
  while (pos < records.size()) {
    const size_t space = records.find(' ', pos);
    if (space == std::string::npos) break;
    const size_t len = std::strtoull(records.c_str() + pos, nullptr, 10);
    if (len == 0 || pos + len > records.size()) break;
    const std::string record = records.substr(space + 1, pos + len - space - 2);  // without "\n"
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    pos += len;
  }
  return "";
}

struct TarMember {
  std::string path;
  int64_t offset = 0;
  int64_t size = 0;
};

std::vector<TarMember> tarMembers(const std::string& shard) {
  Fd fd(shard);
  if (fd.get() < 0) DDP_THROW(DataError, "data: cannot open tar shard '", shard, "' (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    DDP_THROW(DataError, "data: tar shard '", shard, "' is not a regular file: point data.train_files / data.val_files "
              "at the .tar files");
  }
  const int64_t fileSize = st.st_size;
  std::vector<TarMember> members;
  std::string longName;
  uint8_t h[kBlock];
  int64_t at = 0;
  while (true) {
    const int64_t got = readAt(fd.get(), h, kBlock, at);
    if (got == 0) break;  // no end-of-archive blocks: tolerated, as Python's tarfile does
    if (got != kBlock) DDP_THROW(DataError, "data: tar shard '", shard, "' is truncated at byte ", at);
    if (std::all_of(h, h + kBlock, [](uint8_t b) { return b == 0; })) break;  // end of archive
    if (!checksumOk(h)) {
      DDP_THROW(DataError, "data: '", shard, "' is not a tar file or is corrupt (bad header checksum at byte ", at,
                ")");
    }
    bool ok = true;
    const int64_t size = octalField(h + 124, 12, &ok);
    const int64_t data = at + kBlock;
    if (!ok || size < 0 || data + size > fileSize) {
      DDP_THROW(DataError, "data: tar shard '", shard, "' is truncated: the member at byte ", at, " needs ", size,
                " bytes");
    }
    const char type = static_cast<char>(h[156]);
    if (type == 'L' || type == 'x') {  // GNU long name / pax header: the next member's path
      std::string text(static_cast<size_t>(size), '\0');
      readAt(fd.get(), reinterpret_cast<uint8_t*>(text.data()), size, data);
      longName = type == 'L' ? cString(reinterpret_cast<const uint8_t*>(text.data()), text.size()) : paxPath(text);
    } else if (type == '0' || type == '\0' || type == '7') {
      std::string path = cString(h, 100);
      const std::string prefix = cString(h + 345, 155);
      // POSIX ustar ("ustar\0") only: GNU's "ustar  " keeps other fields where the prefix would be.
      if (std::memcmp(h + 257, "ustar\0", 6) == 0 && !prefix.empty()) path = prefix + "/" + path;
      if (!longName.empty()) path = longName;
      members.push_back({path, data, size});
      longName.clear();
    } else {
      longName.clear();  // directories, links, pax globals: not samples
    }
    at = data + (size + kBlock - 1) / kBlock * kBlock;
  }
  return members;
}

// WebDataset's split of a member path: the key is everything before the first '.' of the file
// name, the extension everything after it.
std::pair<std::string, std::string> keyAndExtension(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return {path, ""};
  return {path.substr(0, dot), lower(path.substr(dot + 1))};
}

int64_t parseLabel(const std::string& text, const std::string& where) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  const std::string t = text.substr(b, e - b);
  if (t.empty() || t.size() > 12 || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    DDP_THROW(DataError, "data: label '", where, "' holds '", t.substr(0, 40),
              "', not a class index (a non-negative integer as text)");
  }
  return std::stoll(t);
}

}  // namespace

struct ImageDataset::Impl {
  std::vector<std::string> files;  // folder: one per sample; tar: the shards
  std::vector<Entry> entries;
  std::vector<std::string> classes;
  bool tar = false;
};

ImageDataset::ImageDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ImageDataset::~ImageDataset() = default;
ImageDataset::ImageDataset(ImageDataset&&) noexcept = default;
ImageDataset& ImageDataset::operator=(ImageDataset&&) noexcept = default;

ImageDataset ImageDataset::folder(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    DDP_THROW(DataError, "data: '", root, "' is not a directory; an image folder holds <class>/ folders of .jpg/.png "
              "images (torchvision's ImageFolder layout)");
  }
  auto impl = std::make_unique<Impl>();
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) impl->classes.push_back(entry.path().filename().string());
  }
  // What torchvision's ImageFolder would list but this does not: its other IMG_EXTENSIONS, and
  // links that lead nowhere (it lists them and fails when it reads one). Said, not dropped silently.
  int64_t otherFormats = 0, deadLinks = 0;
  std::string firstOther, firstDead;
  std::sort(impl->classes.begin(), impl->classes.end());
  if (impl->classes.empty()) DDP_THROW(DataError, "data: '", root, "' has no class folders (<class>/image.jpg)");
  for (size_t c = 0; c < impl->classes.size(); ++c) {
    // torchvision's make_dataset: sorted(os.walk(class_dir)), then each folder's sorted file names.
    const fs::path classDir = fs::path(root) / impl->classes[c];
    std::map<std::string, std::vector<std::string>> byFolder;
    byFolder[classDir.string()];
    try {
      for (const auto& entry : fs::recursive_directory_iterator(classDir, fs::directory_options::follow_directory_symlink)) {
        // torchvision's has_file_allowed_extension: the lower-case name ends with one (a file named
        // ".png" too, which has no extension to std::filesystem).
        const std::string name = lower(entry.path().filename().string());
        const auto endsWith = [&name](std::initializer_list<const char*> suffixes) {
          for (const std::string suffix : suffixes) {
            if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
              return true;
            }
          }
          return false;
        };
        const bool ours = endsWith({".jpg", ".jpeg", ".png"});
        // The first in the listing's (sorted) order, not the directory's.
        const auto earliest = [](std::string& first, const std::string& path) {
          if (first.empty() || path < first) first = path;
        };
        if (!entry.is_regular_file()) {
          if (ours && entry.is_symlink() && !entry.exists()) {
            ++deadLinks;
            earliest(firstDead, entry.path().string());
          }
          continue;
        }
        if (ours) {
          byFolder[entry.path().parent_path().string()].push_back(entry.path().filename().string());
        } else if (endsWith({".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})) {
          ++otherFormats;
          earliest(firstOther, entry.path().string());
        }
      }
    } catch (const fs::filesystem_error& e) {
      const bool loop = e.code() == std::errc::too_many_symbolic_link_levels;
      DDP_THROW(DataError, "data: cannot list class folder '", classDir.string(), "' (", e.code().message(), " at '",
                e.path1().string(), "'): ", loop ? "a symbolic link under it leads back to a folder above it; remove "
                "the link or point it outside the class folder" : "check that the folders are readable");
    }
    size_t before = impl->entries.size();
    for (auto& [folder, names] : byFolder) {
      std::sort(names.begin(), names.end());
      for (const auto& n : names) {
        impl->entries.push_back({static_cast<int32_t>(impl->files.size()), 0, -1, static_cast<int64_t>(c), ""});
        impl->files.push_back(folder + "/" + n);
      }
    }
    if (impl->entries.size() == before) {
      DDP_THROW(DataError, "data: class folder '", classDir.string(),
                "' has no .jpg/.jpeg/.png images; every class needs some (or remove the folder)");
    }
  }
  // Once per folder in this process (the worker may list a split twice: to decide, then to load).
  static std::mutex saidMutex;
  static std::set<std::string> said;
  bool first = false;
  if (otherFormats + deadLinks > 0 && launchEnv().rank == 0) {
    std::lock_guard<std::mutex> lock(saidMutex);
    first = said.insert(root).second;
  }
  if (otherFormats > 0 && first) {
    spdlog::warn("data: '{}' holds {} image(s) in formats torchvision's ImageFolder reads but this does not (the "
                 "first: '{}'); only .jpg/.jpeg/.png are samples, these are left out: convert them to use them",
                 root, otherFormats, firstOther);
  }
  if (deadLinks > 0 && first) {
    spdlog::warn("data: '{}' holds {} link(s) to images that do not exist (the first: '{}'); they are left out "
                 "(torchvision's ImageFolder lists them and fails when it reads one)", root, deadLinks, firstDead);
  }
  return ImageDataset(std::move(impl));
}

ImageDataset ImageDataset::tarShards(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> shards;
  if (rc == 0) shards.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  std::sort(shards.begin(), shards.end());
  if (shards.empty()) DDP_THROW(DataError, "data: no tar shard matches '", pattern, "'");
  auto impl = std::make_unique<Impl>();
  impl->tar = true;
  impl->files = shards;
  int64_t maxLabel = -1;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::vector<TarMember> members = tarMembers(shards[s]);
    Fd fd(shards[s]);
    // Consecutive members with the same key make one sample.
    size_t m = 0;
    while (m < members.size()) {
      const std::string key = keyAndExtension(members[m].path).first;
      const TarMember* image = nullptr;
      const TarMember* cls = nullptr;
      for (; m < members.size() && keyAndExtension(members[m].path).first == key; ++m) {
        const std::string ext = keyAndExtension(members[m].path).second;
        if (isImageExtension(ext)) {
          if (image != nullptr) {
            DDP_THROW(DataError, "data: tar shard '", shards[s], "': sample '", key, "' has two images ('",
                      image->path, "' and '", members[m].path, "')");
          }
          image = &members[m];
        } else if (ext == "cls") {
          cls = &members[m];
        }  // other members (.json, .txt, ...) are not ours
      }
      if (image == nullptr && cls == nullptr) continue;
      if (image == nullptr) {
        DDP_THROW(DataError, "data: tar shard '", shards[s], "': '", cls->path, "' has no image (", key,
                  ".jpg, .jpeg or .png) beside it");
      }
      if (cls == nullptr) {
        DDP_THROW(DataError, "data: tar shard '", shards[s], "': '", image->path, "' has no label (", key,
                  ".cls holding the class index) beside it");
      }
      std::string text(static_cast<size_t>(std::min<int64_t>(cls->size, 64)), '\0');
      readAt(fd.get(), reinterpret_cast<uint8_t*>(text.data()), static_cast<int64_t>(text.size()), cls->offset);
      const int64_t label = parseLabel(text, shards[s] + ":" + cls->path);
      maxLabel = std::max(maxLabel, label);
      impl->entries.push_back({static_cast<int32_t>(s), image->offset, image->size, label, image->path});
    }
  }
  if (impl->entries.empty()) DDP_THROW(DataError, "data: the tar shards '", pattern, "' hold no samples");
  for (int64_t c = 0; c <= maxLabel; ++c) impl->classes.push_back(std::to_string(c));
  return ImageDataset(std::move(impl));
}

int64_t ImageDataset::size() const { return static_cast<int64_t>(impl_->entries.size()); }
const std::vector<std::string>& ImageDataset::classes() const { return impl_->classes; }

int64_t ImageDataset::label(int64_t index) const {
  DDP_ENFORCE(index >= 0 && index < size(), "sample ", index, " of ", size());
  return impl_->entries[static_cast<size_t>(index)].label;
}

std::string ImageDataset::name(int64_t index) const {
  DDP_ENFORCE(index >= 0 && index < size(), "sample ", index, " of ", size());
  const Entry& e = impl_->entries[static_cast<size_t>(index)];
  return impl_->tar ? impl_->files[static_cast<size_t>(e.file)] + ":" + e.member : impl_->files[static_cast<size_t>(e.file)];
}

std::vector<uint8_t> ImageDataset::read(int64_t index) const {
  DDP_ENFORCE(index >= 0 && index < size(), "sample ", index, " of ", size());
  const Entry& e = impl_->entries[static_cast<size_t>(index)];
  const std::string& path = impl_->files[static_cast<size_t>(e.file)];
  Fd fd(path);
  if (fd.get() < 0) DDP_THROW(DataError, "data: cannot read image '", name(index), "' (", std::strerror(errno), ")");
  int64_t size = e.size;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) DDP_THROW(DataError, "data: cannot read image '", path, "' (", std::strerror(errno), ")");
  if (!S_ISREG(st.st_mode)) DDP_THROW(DataError, "data: image '", path, "' is not a regular file");
  if (size < 0) size = st.st_size;
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (readAt(fd.get(), bytes.data(), size, e.offset) != size) {
    DDP_THROW(DataError, "data: cannot read image '", name(index), "' (", size, " bytes expected)");
  }
  return bytes;
}

}  // namespace ddp
