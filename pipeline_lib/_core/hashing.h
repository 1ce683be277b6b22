// Small open-addressing hash maps (no external dependencies).
//
//   hash_bytes(p, n)  -- fast 64-bit hash of a byte string (wyhash-style multiply-mix).
//   BytesMap<V>       -- byte string -> V. Keys live in one arena; entries are stored in
//                        insertion order (so callers can iterate them), the probe table
//                        holds (tag, entry index) pairs. Linear probing, load <= 1/2.
//   U64Map<V>         -- uint64 key -> V, linear probing; key ~0 is reserved (empty).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace tokcore {

namespace detail {
inline uint64_t read64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
inline uint64_t read32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint64_t mix(uint64_t a, uint64_t b) {
    __uint128_t r = static_cast<__uint128_t>(a) * b;
    return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}
constexpr uint64_t kP0 = 0xa0761d6478bd642full;
constexpr uint64_t kP1 = 0xe7037ed1a0b428dbull;
constexpr uint64_t kP2 = 0x8ebc6af09c88c6e3ull;
}  // namespace detail

inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
    using namespace detail;
    uint64_t seed = kP0 ^ (static_cast<uint64_t>(n) * kP2);
    uint64_t a, b;
    if (n <= 16) {
        if (n >= 4) {
            a = (read32(p) << 32) | read32(p + ((n >> 3) << 2));
            b = (read32(p + n - 4) << 32) | read32(p + n - 4 - ((n >> 3) << 2));
        } else if (n > 0) {
            a = (static_cast<uint64_t>(p[0]) << 16) | (static_cast<uint64_t>(p[n >> 1]) << 8) | p[n - 1];
            b = 0;
        } else {
            a = b = 0;
        }
    } else {
        size_t i = n;
        while (i > 16) {
            seed = mix(read64(p) ^ kP1, read64(p + 8) ^ seed);
            p += 16;
            i -= 16;
        }
        a = read64(p + i - 16);
        b = read64(p + i - 8);
    }
    return mix(kP1 ^ n, mix(a ^ kP1, b ^ seed));
}

// Equality of two byte strings of length n; short keys without a call to memcmp.
inline bool bytes_equal(const uint8_t* a, const uint8_t* b, size_t n) {
    using detail::read32;
    using detail::read64;
    if (n >= 8) {
        if (n > 16) return std::memcmp(a, b, n) == 0;
        return read64(a) == read64(b) && read64(a + n - 8) == read64(b + n - 8);
    }
    if (n >= 4) return read32(a) == read32(b) && read32(a + n - 4) == read32(b + n - 4);
    for (size_t i = 0; i < n; ++i)
        if (a[i] != b[i]) return false;
    return true;
}

inline uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

template <class V>
class BytesMap {
public:
    struct Entry {
        uint64_t off;
        uint32_t len;
        uint64_t hash;
        V value;
    };

    explicit BytesMap(size_t expected = 16) { reset(expected); }

    void reset(size_t expected = 16) {
        size_t cap = 16;
        while (cap < expected * 2) cap <<= 1;
        slots_.assign(cap, Slot{0, 0});
        mask_ = cap - 1;
        entries_.clear();
        arena_.clear();
    }

    size_t size() const { return entries_.size(); }
    size_t arena_bytes() const { return arena_.size(); }
    const std::vector<Entry>& entries() const { return entries_; }
    std::vector<Entry>& entries() { return entries_; }
    const uint8_t* key_data(const Entry& e) const { return arena_.data() + e.off; }

    // Value for the key, or nullptr.
    V* find(const uint8_t* p, size_t n, uint64_t h) {
        const uint32_t tag = static_cast<uint32_t>(h >> 32);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot s = slots_[i];
            if (s.idx == 0) return nullptr;
            if (s.tag == tag) {
                Entry& e = entries_[s.idx - 1];
                if (e.len == n && bytes_equal(arena_.data() + e.off, p, n)) return &e.value;
            }
        }
    }
    const V* find(const uint8_t* p, size_t n, uint64_t h) const {
        return const_cast<BytesMap*>(this)->find(p, n, h);
    }
    V* find(const uint8_t* p, size_t n) { return find(p, n, hash_bytes(p, n)); }
    const V* find(const uint8_t* p, size_t n) const { return find(p, n, hash_bytes(p, n)); }

    // Reference to the value for the key, inserting `init` if absent.
    V& get_or_insert(const uint8_t* p, size_t n, uint64_t h, const V& init, bool* inserted = nullptr) {
        const uint32_t tag = static_cast<uint32_t>(h >> 32);
        size_t i = h & mask_;
        for (;; i = (i + 1) & mask_) {
            const Slot s = slots_[i];
            if (s.idx == 0) break;
            if (s.tag == tag) {
                Entry& e = entries_[s.idx - 1];
                if (e.len == n && bytes_equal(arena_.data() + e.off, p, n)) {
                    if (inserted) *inserted = false;
                    return e.value;
                }
            }
        }
        if (n > 0xFFFFFFFFu) throw std::length_error("a key of 4 GiB or more");  // Entry::len is 32-bit
        if (inserted) *inserted = true;
        const uint64_t off = arena_.size();
        arena_.insert(arena_.end(), p, p + n);
        entries_.push_back(Entry{off, static_cast<uint32_t>(n), h, init});
        slots_[i] = Slot{tag, static_cast<uint32_t>(entries_.size())};
        if (entries_.size() * 2 > slots_.size()) grow();
        return entries_.back().value;
    }
    V& get_or_insert(const uint8_t* p, size_t n, const V& init, bool* inserted = nullptr) {
        return get_or_insert(p, n, hash_bytes(p, n), init, inserted);
    }

private:
    struct Slot {
        uint32_t tag;
        uint32_t idx;  // entry index + 1; 0 = empty
    };

    void grow() {
        const size_t cap = slots_.size() * 2;
        slots_.assign(cap, Slot{0, 0});
        mask_ = cap - 1;
        for (size_t k = 0; k < entries_.size(); ++k) {
            const uint64_t h = entries_[k].hash;
            size_t i = h & mask_;
            while (slots_[i].idx != 0) i = (i + 1) & mask_;
            slots_[i] = Slot{static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(k + 1)};
        }
    }

    std::vector<Slot> slots_;
    std::vector<Entry> entries_;
    std::vector<uint8_t> arena_;
    size_t mask_ = 0;
};

template <class V>
class U64Map {
public:
    static constexpr uint64_t kEmpty = ~0ull;

    explicit U64Map(size_t expected = 16) { reset(expected); }

    void reset(size_t expected = 16) {
        size_t cap = 16;
        while (cap < expected * 2) cap <<= 1;
        slots_.assign(cap, Slot{kEmpty, V{}});
        mask_ = cap - 1;
        size_ = 0;
    }

    size_t size() const { return size_; }

    // Start fetching the slot where a lookup of `key` begins.
    void prefetch(uint64_t key) const { __builtin_prefetch(&slots_[hash_u64(key) & mask_]); }

    const V* find(uint64_t key) const {
        for (size_t i = hash_u64(key) & mask_;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key == key) return &s.val;
            if (s.key == kEmpty) return nullptr;
        }
    }
    V* find(uint64_t key) { return const_cast<V*>(static_cast<const U64Map*>(this)->find(key)); }

    V& get_or_insert(uint64_t key, const V& init, bool* inserted = nullptr) {
        size_t i = hash_u64(key) & mask_;
        for (;; i = (i + 1) & mask_) {
            const uint64_t k = slots_[i].key;
            if (k == key) {
                if (inserted) *inserted = false;
                return slots_[i].val;
            }
            if (k == kEmpty) break;
        }
        if (inserted) *inserted = true;
        if ((size_ + 1) * 2 > slots_.size()) {
            grow();
            i = hash_u64(key) & mask_;
            while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
        }
        slots_[i] = Slot{key, init};
        ++size_;
        return slots_[i].val;
    }

    template <class F>
    void for_each(F&& f) const {
        for (const Slot& s : slots_)
            if (s.key != kEmpty) f(s.key, s.val);
    }

private:
    struct Slot {
        uint64_t key;
        V val;
    };

    void grow() {
        std::vector<Slot> old;
        old.swap(slots_);
        const size_t cap = old.size() * 2;
        slots_.assign(cap, Slot{kEmpty, V{}});
        mask_ = cap - 1;
        for (const Slot& s : old) {
            if (s.key == kEmpty) continue;
            size_t i = hash_u64(s.key) & mask_;
            while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
            slots_[i] = s;
        }
    }

    std::vector<Slot> slots_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

}  // namespace tokcore
