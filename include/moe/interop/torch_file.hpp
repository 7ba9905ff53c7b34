#pragma once
// Tensors from the files PyTorch-based engines write, read without PyTorch:
//
//   read_torch_save   a torch.save() file (zip archive: <name>/data.pkl, a pickle, plus one raw
//                     little-endian storage per tensor in <name>/data/<key>), read through libzip.
//                     The pickle is interpreted by a small stack machine that accepts only what
//                     torch.save writes for dicts, lists and tuples of ints, floats, strings, None
//                     and tensors (protocols 2 to 5); like torch.load(weights_only=True) it calls no
//                     code, and any other global is an error.
//   read_safetensors  a .safetensors file: 8-byte little-endian header size, a JSON header
//                     {"name": {"dtype", "shape", "data_offsets": [begin, end]}}, then the data.
//
// Only integer tensors are returned (int8/16/32/64, uint8): what the engines' statistics hold.
// Every size the file states is checked against the file's own length and against
// core::limits::profile_values before anything is allocated.

#include <zip.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <istream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"

namespace moe::profile::torch_file {

/// A dense integer tensor in row-major order.
struct Tensor {
  std::string dtype;  ///< "int32", "int64", ...
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> values;
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

/// Largest tensor (elements) and pickle (bytes) accepted.
inline constexpr std::int64_t max_elements = core::limits::profile_values;
inline constexpr std::int64_t max_pickle_bytes = 1LL << 20;  // a statistics dict pickles to < 1 KiB

namespace detail {

inline int element_size(std::string const& dtype) {
  if (dtype == "int8" || dtype == "uint8") return 1;
  if (dtype == "int16") return 2;
  if (dtype == "int32") return 4;
  if (dtype == "int64") return 8;
  return 0;
}

/// Little-endian integers of `dtype` from raw bytes.
inline std::int64_t load_int(unsigned char const* p, std::string const& dtype) {
  static_assert(std::endian::native == std::endian::little, "moe: the storage readers assume a little-endian host");
  if (dtype == "int8") return static_cast<std::int8_t>(*p);
  if (dtype == "uint8") return *p;
  if (dtype == "int16") {
    std::int16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  if (dtype == "int32") {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  std::int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline std::int64_t checked_numel(std::vector<std::int64_t> const& shape, std::string const& what) {
  std::int64_t n = 1;
  for (auto s : shape) {
    check(s >= 0, what, ": negative dimension ", s);
    check(s == 0 || n <= max_elements / s, what, ": more than ", max_elements, " elements");
    n *= s;
  }
  return n;
}

// ----- pickle values ------------------------------------------------------------------------------

struct Value;
using Ptr = Value*;  ///< into the Unpickler's arena, which owns every value (cycles included)
struct Global {
  std::string name;  ///< "module.qualname"
};
struct Storage {
  std::string dtype, key;
  std::int64_t numel = 0;
};
struct TensorRef {
  Storage storage;
  std::int64_t offset = 0;
  std::vector<std::int64_t> shape, stride;
};
struct Items {
  std::vector<Ptr> v;
};
struct Dict {
  std::vector<std::pair<Ptr, Ptr>> v;
};
struct None {};
struct Value {
  std::variant<None, bool, std::int64_t, double, std::string, Items /*tuple*/, Dict, Global, Storage, TensorRef> v;
  bool list = false;  ///< Items that came from a list (mutable)
};

/// The pickle stack machine (opcodes torch.save emits, protocols 2-5). Every value lives in the
/// machine's arena, so a pickle that builds a cycle (a list holding itself, which pickles may do)
/// neither leaks nor recurses; the result of run() lives as long as the Unpickler.
class Unpickler {
 public:
  Unpickler(std::vector<unsigned char> const& data, std::string name) : d_(data), name_(std::move(name)) {}

  Ptr run() {
    while (true) {
      check(pos_ < d_.size(), name_, ": pickle ends without STOP");
      std::size_t at = pos_;
      unsigned char op = d_[pos_++];
      switch (op) {
        case 0x80:
          take(1);
          break;  // PROTO
        case 0x95:
          take(8);
          break;     // FRAME
        case '.': {  // STOP
          check(stack_.size() == 1 && marks_.empty(), name_, ": pickle stack malformed at STOP");
          return stack_.back();
        }
        case '(':
          marks_.push_back(stack_.size());
          break;
        case '}':
          push(make(Dict{}));
          break;
        case ']': {
          auto v = make(Items{});
          v->list = true;
          push(v);
          break;
        }
        case ')':
          push(make(Items{}));
          break;
        case 't':
          push(tuple(pop_mark()));
          break;
        case 0x85:
          push(tuple(pop_n(1)));
          break;
        case 0x86:
          push(tuple(pop_n(2)));
          break;
        case 0x87:
          push(tuple(pop_n(3)));
          break;
        case 'J':
          push(make(static_cast<std::int64_t>(le_signed(take(4), 4))));
          break;
        case 'K':
          push(make(static_cast<std::int64_t>(*take(1))));
          break;
        case 'M':
          push(make(static_cast<std::int64_t>(le_unsigned(take(2), 2))));
          break;
        case 0x8a: {  // LONG1
          unsigned n = *take(1);
          check(n <= 8, name_, ": integer of ", n, " bytes at offset ", at, " is too large");
          push(make(n == 0 ? std::int64_t{0} : le_signed(take(n), n)));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          auto p = take(8);
          std::uint64_t u = 0;
          for (int i = 0; i < 8; ++i) u = (u << 8) | p[i];
          push(make(std::bit_cast<double>(u)));
          break;
        }
        case 'N':
          push(make(None{}));
          break;
        case 0x88:
          push(make(true));
          break;
        case 0x89:
          push(make(false));
          break;
        case 'X':
          push(make(str(le_unsigned(take(4), 4))));
          break;
        case 0x8c:
          push(make(str(*take(1))));
          break;
        case 0x8d:
          push(make(str(le_unsigned(take(8), 8))));
          break;
        case 'T':
          push(make(str(le_unsigned(take(4), 4))));
          break;
        case 'U':
          push(make(str(*take(1))));
          break;
        case 'c': {  // GLOBAL module\nname\n
          auto mod = line(), nm = line();
          push(make(Global{mod + "." + nm}));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          auto nm = pop(), mod = pop();
          push(make(Global{as_string(mod) + "." + as_string(nm)}));
          break;
        }
        case 'q':
          memo_put(*take(1));
          break;
        case 'r':
          memo_put(le_unsigned(take(4), 4));
          break;
        case 0x94:
          memo_put(memo_.size());
          break;
        case 'h':
          push(memo_get(*take(1)));
          break;
        case 'j':
          push(memo_get(le_unsigned(take(4), 4)));
          break;
        case 'Q':
          push(persistent(pop()));
          break;
        case 'R': {
          auto args = pop(), fn = pop();
          push(reduce(fn, args));
          break;
        }
        case 's': {
          auto v = pop(), k = pop();
          dict_of(top()).v.emplace_back(k, v);
          break;
        }
        case 'u': {
          auto kv = pop_mark();
          check(kv.size() % 2 == 0, name_, ": SETITEMS with an odd number of items at offset ", at);
          for (std::size_t i = 0; i < kv.size(); i += 2) dict_of(top()).v.emplace_back(kv[i], kv[i + 1]);
          break;
        }
        case 'a': {
          auto v = pop();
          list_of(top()).v.push_back(v);
          break;
        }
        case 'e': {
          auto vs = pop_mark();
          for (auto& v : vs) list_of(top()).v.push_back(v);
          break;
        }
        default:
          fail(name_, ": pickle opcode 0x", std::hex, static_cast<int>(op), std::dec, " at offset ", at,
               " is not one torch.save writes for tensors and containers");
      }
    }
  }

 private:
  template <class T>
  Ptr make(T x) {
    arena_.emplace_back();
    arena_.back().v = std::move(x);
    return &arena_.back();
  }
  unsigned char const* take(std::size_t n) {
    check(n <= d_.size() - pos_, name_, ": pickle truncated at offset ", pos_);
    auto p = d_.data() + pos_;
    pos_ += n;
    return p;
  }
  static std::uint64_t le_unsigned(unsigned char const* p, unsigned n) {
    std::uint64_t u = 0;
    for (unsigned i = 0; i < n; ++i) u |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    return u;
  }
  static std::int64_t le_signed(unsigned char const* p, unsigned n) {
    std::uint64_t u = le_unsigned(p, n);
    if (n < 8 && (u >> (8 * n - 1)) & 1) u |= ~std::uint64_t{0} << (8 * n);
    return static_cast<std::int64_t>(u);
  }
  std::string str(std::uint64_t n) {
    check(n <= d_.size() - pos_, name_, ": string of ", n, " bytes runs past the end of the pickle");
    auto p = take(n);
    return {reinterpret_cast<char const*>(p), n};
  }
  std::string line() {
    std::string s;
    while (true) {
      char c = static_cast<char>(*take(1));
      if (c == '\n') return s;
      s += c;
      check(s.size() < 4096, name_, ": GLOBAL name too long");
    }
  }
  void push(Ptr v) { stack_.push_back(std::move(v)); }
  Ptr pop() {
    check(stack_.size() > (marks_.empty() ? 0 : marks_.back()), name_, ": pickle stack underflow at offset ", pos_ - 1);
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Ptr const& top() {
    check(!stack_.empty(), name_, ": pickle stack empty at offset ", pos_ - 1);
    return stack_.back();
  }
  std::vector<Ptr> pop_n(std::size_t n) {
    std::vector<Ptr> out(n);
    for (std::size_t i = n; i-- > 0;) out[i] = pop();
    return out;
  }
  std::vector<Ptr> pop_mark() {
    check(!marks_.empty(), name_, ": pickle has no MARK at offset ", pos_ - 1);
    std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Ptr> out(stack_.begin() + static_cast<long>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  Ptr tuple(std::vector<Ptr> items) { return make(Items{std::move(items)}); }
  Dict& dict_of(Ptr const& p) {
    auto* d = std::get_if<Dict>(&p->v);
    check(d != nullptr, name_, ": SETITEM on something that is not a dict at offset ", pos_ - 1);
    return *d;
  }
  Items& list_of(Ptr const& p) {
    auto* d = std::get_if<Items>(&p->v);
    check(d != nullptr && p->list, name_, ": APPEND on something that is not a list at offset ", pos_ - 1);
    return *d;
  }
  std::string const& as_string(Ptr const& p) {
    auto* s = std::get_if<std::string>(&p->v);
    check(s != nullptr, name_, ": expected a string at offset ", pos_ - 1);
    return *s;
  }
  void memo_put(std::uint64_t i) {
    check(!stack_.empty(), name_, ": memoising an empty stack");
    check(i <= d_.size(), name_, ": memo index ", i, " out of range");
    memo_[i] = stack_.back();
  }
  Ptr memo_get(std::uint64_t i) {
    auto it = memo_.find(i);
    check(it != memo_.end(), name_, ": memo ", i, " read before it was written");
    return it->second;
  }
  std::int64_t as_int(Ptr const& p, char const* what) {
    auto* i = std::get_if<std::int64_t>(&p->v);
    check(i != nullptr, name_, ": ", what, " is not an integer");
    return *i;
  }
  std::vector<std::int64_t> int_tuple(Ptr const& p, char const* what) {
    auto* t = std::get_if<Items>(&p->v);
    check(t != nullptr && t->v.size() <= 16, name_, ": ", what, " is not a short tuple of integers");
    std::vector<std::int64_t> out;
    for (auto const& x : t->v) out.push_back(as_int(x, what));
    return out;
  }
  // ('storage', torch.<Type>Storage, key, location, numel)
  Ptr persistent(Ptr const& pid) {
    auto* t = std::get_if<Items>(&pid->v);
    check(t != nullptr && t->v.size() == 5, name_,
          ": persistent id is not a 5-tuple ('storage', type, key, location, numel)");
    check(as_string(t->v[0]) == "storage", name_, ": persistent id kind '", as_string(t->v[0]), "' is not 'storage'");
    auto* g = std::get_if<Global>(&t->v[1]->v);
    check(g != nullptr, name_, ": storage type is not a global");
    static std::map<std::string, std::string> const types{{"torch.IntStorage", "int32"},
                                                          {"torch.LongStorage", "int64"},
                                                          {"torch.ShortStorage", "int16"},
                                                          {"torch.CharStorage", "int8"},
                                                          {"torch.ByteStorage", "uint8"}};
    auto it = types.find(g->name);
    check(it != types.end(), name_, ": storage type ", g->name, " is not an integer storage");
    Storage s{it->second, as_string(t->v[2]), as_int(t->v[4], "storage size")};
    check(s.numel >= 0 && s.numel <= max_elements, name_, ": storage '", s.key, "' of ", s.numel, " elements");
    return make(s);
  }
  Ptr reduce(Ptr const& fn, Ptr const& args) {
    auto* g = std::get_if<Global>(&fn->v);
    check(g != nullptr, name_, ": REDUCE of something that is not a global");
    auto* a = std::get_if<Items>(&args->v);
    check(a != nullptr, name_, ": REDUCE arguments are not a tuple");
    if (g->name == "collections.OrderedDict") {
      check(a->v.empty(), name_, ": OrderedDict with arguments");
      return make(Dict{});
    }
    if (g->name == "torch._utils._rebuild_tensor_v2" || g->name == "torch._utils._rebuild_tensor") {
      check(a->v.size() >= 4, name_, ": _rebuild_tensor_v2 with ", a->v.size(), " arguments");
      auto* s = std::get_if<Storage>(&a->v[0]->v);
      check(s != nullptr, name_, ": tensor without a storage");
      TensorRef t{*s, as_int(a->v[1], "storage offset"), int_tuple(a->v[2], "tensor size"),
                  int_tuple(a->v[3], "tensor stride")};
      check(t.shape.size() == t.stride.size(), name_, ": tensor size and stride differ in rank");
      return make(t);
    }
    fail(name_, ": the pickle calls ", g->name, ", which a statistics file has no reason to call (refused)");
  }

  std::vector<unsigned char> const& d_;
  std::string name_;
  std::size_t pos_ = 0;
  std::deque<Value> arena_;  // stable addresses
  std::vector<Ptr> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint64_t, Ptr> memo_;
};

/// A zip archive read through libzip.
class Zip {
 public:
  explicit Zip(std::string const& path) : path_(path) {
    int err = 0;
    z_ = zip_open(path.c_str(), ZIP_RDONLY, &err);
    if (z_ == nullptr) {
      zip_error_t ze;
      zip_error_init_with_code(&ze, err);
      std::string msg = zip_error_strerror(&ze);
      zip_error_fini(&ze);
      fail(path, ": not a readable zip archive (torch.save format): ", msg);
    }
  }
  Zip(Zip const&) = delete;
  Zip& operator=(Zip const&) = delete;
  ~Zip() { zip_discard(z_); }

  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    auto n = zip_get_num_entries(z_, 0);
    for (zip_int64_t i = 0; i < n; ++i)
      if (char const* s = zip_get_name(z_, static_cast<zip_uint64_t>(i), 0)) out.emplace_back(s);
    return out;
  }
  /// The whole entry; at most `limit` bytes are accepted.
  [[nodiscard]] std::vector<unsigned char> read(std::string const& entry, std::int64_t limit) const {
    zip_stat_t st;
    zip_stat_init(&st);
    check(zip_stat(z_, entry.c_str(), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE), path_, ": archive has no entry '",
          entry, "'");
    check(st.size <= static_cast<zip_uint64_t>(limit), path_, ": entry '", entry, "' has ", st.size,
          " bytes, above the limit of ", limit);
    zip_file_t* f = zip_fopen(z_, entry.c_str(), 0);
    check(f != nullptr, path_, ": cannot open entry '", entry, "': ", zip_strerror(z_));
    std::vector<unsigned char> out(st.size);
    auto got = st.size == 0 ? 0 : zip_fread(f, out.data(), st.size);
    std::string err = got < 0 ? zip_file_strerror(f) : "";
    zip_fclose(f);
    check(got == static_cast<zip_int64_t>(st.size), path_, ": entry '", entry, "' is truncated or corrupt ", err);
    return out;
  }

 private:
  std::string path_;
  zip_t* z_ = nullptr;
};

}  // namespace detail

/// The tensors of a torch.save() file whose top level is a dict: the entries that are tensors,
/// by key (other entries, e.g. ints, floats or None, are skipped).
inline std::map<std::string, Tensor> read_torch_save(std::string const& path) {
  detail::Zip zip(path);
  std::string pkl;
  for (auto const& n : zip.names())
    if (n.size() >= 9 && n.compare(n.size() - 9, 9, "/data.pkl") == 0 && n.find('/') == n.size() - 9) {
      check(pkl.empty(), path, ": more than one data.pkl in the archive");
      pkl = n;
    }
  check(!pkl.empty(), path, ": no <name>/data.pkl in the archive (not a torch.save file)");
  std::string prefix = pkl.substr(0, pkl.size() - 8);
  for (auto const& n : zip.names())
    if (n == prefix + "byteorder") {
      auto b = zip.read(n, 16);
      check(std::string(b.begin(), b.end()) == "little", path, ": byteorder '", std::string(b.begin(), b.end()),
            "' is not little");
    }
  auto bytes = zip.read(pkl, max_pickle_bytes);
  detail::Unpickler unpickler(bytes, path + ":" + pkl);
  auto root = unpickler.run();
  auto* dict = std::get_if<detail::Dict>(&root->v);
  check(dict != nullptr, path, ": the saved object is not a dict");
  std::map<std::string, Tensor> out;
  for (auto const& [k, v] : dict->v) {
    auto* key = std::get_if<std::string>(&k->v);
    auto* t = std::get_if<detail::TensorRef>(&v->v);
    if (key == nullptr || t == nullptr) continue;
    std::string what = path + ": tensor '" + *key + "'";
    Tensor out_t{t->storage.dtype, t->shape, {}};
    auto n = detail::checked_numel(t->shape, what);
    int es = detail::element_size(t->storage.dtype);
    auto raw = zip.read(prefix + "data/" + t->storage.key, t->storage.numel * es);
    check(static_cast<std::int64_t>(raw.size()) == t->storage.numel * es, what, ": storage '", t->storage.key, "' has ",
          raw.size(), " bytes, expected ", t->storage.numel * es);
    // Highest element index the view reaches must lie inside the storage.
    std::int64_t last = t->offset;
    for (std::size_t d = 0; d < t->shape.size(); ++d) {
      check(t->stride[d] >= 0, what, ": negative stride");
      if (t->shape[d] > 0) last += (t->shape[d] - 1) * t->stride[d];
    }
    check(t->offset >= 0 && (n == 0 || last < t->storage.numel), what, ": view reaches element ", last,
          " of a storage of ", t->storage.numel);
    out_t.values.resize(static_cast<std::size_t>(n));
    std::vector<std::int64_t> idx(t->shape.size(), 0);
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t off = t->offset;
      for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * t->stride[d];
      out_t.values[static_cast<std::size_t>(i)] = detail::load_int(raw.data() + off * es, t->storage.dtype);
      for (std::size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < t->shape[d]) break;
        idx[d] = 0;
      }
    }
    out.emplace(*key, std::move(out_t));
  }
  return out;
}

/// The tensors of a .safetensors stream, by name (integer dtypes only; others are an error).
/// `path` names the input in messages.
inline std::map<std::string, Tensor> read_safetensors(std::istream& f, std::string const& path) {
  f.seekg(0, std::ios::end);
  auto size = static_cast<std::int64_t>(f.tellg());
  f.seekg(0);
  check(size >= 8, path, ": ", size, " bytes, too short for a safetensors header");
  unsigned char h8[8];
  f.read(reinterpret_cast<char*>(h8), 8);
  std::uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<std::uint64_t>(h8[i]) << (8 * i);
  check(hlen <= static_cast<std::uint64_t>(size - 8) && hlen <= (100u << 20), path, ": header size ", hlen,
        " runs past the end of the file (", size, " bytes) or above 100 MiB");
  std::string header(hlen, '\0');
  f.read(header.data(), static_cast<std::streamsize>(hlen));
  check(static_cast<bool>(f), path, ": cannot read the header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (nlohmann::json::exception const& e) {
    fail(path, ": header is not valid JSON: ", e.what());
  }
  check(j.is_object(), path, ": header is not a JSON object");
  std::int64_t data_size = size - 8 - static_cast<std::int64_t>(hlen);
  static std::map<std::string, std::string> const dtypes{
      {"I64", "int64"}, {"I32", "int32"}, {"I16", "int16"}, {"I8", "int8"}, {"U8", "uint8"}};
  std::map<std::string, Tensor> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    std::string what = path + ": tensor '" + it.key() + "'";
    auto const& e = it.value();
    check(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), what,
          ": needs dtype, shape and data_offsets");
    check(e["dtype"].is_string(), what, ": dtype is not a string");
    auto dt = dtypes.find(e["dtype"].get<std::string>());
    check(dt != dtypes.end(), what, ": dtype ", e["dtype"].get<std::string>(), " is not an integer type");
    check(e["shape"].is_array() && e["shape"].size() <= 16, what, ": shape is not a short array");
    Tensor t{dt->second, {}, {}};
    for (auto const& s : e["shape"]) {
      check(s.is_number_integer(), what, ": shape entry ", s.dump(), " is not an integer");
      t.shape.push_back(s.get<std::int64_t>());
    }
    auto n = detail::checked_numel(t.shape, what);
    auto const& o = e["data_offsets"];
    check(o.is_array() && o.size() == 2 && o[0].is_number_integer() && o[1].is_number_integer(), what,
          ": data_offsets must be [begin, end]");
    auto b = o[0].get<std::int64_t>(), en = o[1].get<std::int64_t>();
    int es = detail::element_size(t.dtype);
    check(0 <= b && b <= en && en <= data_size, what, ": data_offsets [", b, ", ", en, "] outside the ", data_size,
          " data bytes");
    check(en - b == n * es, what, ": data_offsets span ", en - b, " bytes, the shape needs ", n * es);
    std::vector<unsigned char> raw(static_cast<std::size_t>(en - b));
    f.seekg(static_cast<std::streamoff>(8 + hlen) + b);
    f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
    check(static_cast<bool>(f), what, ": cannot read its data");
    t.values.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      t.values[static_cast<std::size_t>(i)] = detail::load_int(raw.data() + i * es, t.dtype);
    out.emplace(it.key(), std::move(t));
  }
  return out;
}

/// The tensors of a .safetensors file, by name.
inline std::map<std::string, Tensor> read_safetensors(std::string const& path) {
  std::ifstream f(path, std::ios::binary);
  check(f.is_open(), "cannot open '", path, "' for reading");
  return read_safetensors(f, path);
}

}  // namespace moe::profile::torch_file
