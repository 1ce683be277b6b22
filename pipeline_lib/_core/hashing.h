// Small open-addressing hash maps (no external dependencies).
//
//   hash_bytes(p, n)  -- fast 64-bit hash of a byte string (wyhash-style multiply-mix);
//                        Key(p, n) holds it with the key's head word, to look up in many maps.
//   BytesMap<V>       -- byte string -> V. Keys live in one arena; entries are stored in
//                        insertion order (so callers can iterate them), the probe table
//                        holds (tag, entry index) pairs. Linear probing, load <= 1/2.
//                        An entry holds its key's head word (head_word), so a lookup of a
//                        key of <= 8 bytes -- most pre-tokenized pieces -- compares within the
//                        entry and never reads the arena: one cache miss fewer per lookup.
//   U64Map<V>         -- uint64 key -> V, linear probing; key ~0 is reserved (empty).
//   BigVector<T>      -- a std::vector whose buffer, from 1 MiB up, is whole huge pages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

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

// The key's first bytes as one word: for n <= 8 all of them (with n, a unique name of the
// key; the two 4-byte reads overlap for n < 8), else the first 8.
inline uint64_t head_word(const uint8_t* p, size_t n) {
    using detail::read32;
    if (n >= 8) return detail::read64(p);
    if (n >= 4) return read32(p) | (read32(p + n - 4) << 32);
    if (n > 0) return p[0] | (static_cast<uint64_t>(p[n >> 1]) << 8) | (static_cast<uint64_t>(p[n - 1]) << 16);
    return 0;
}

// Hash of the n bytes at p, whose head_word is `head` (a key of <= 8 bytes is hashed from it
// alone, without reading its bytes again).
inline uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t head) {
    using namespace detail;
    uint64_t seed = kP0 ^ (static_cast<uint64_t>(n) * kP2);
    uint64_t a, b;
    if (n <= 8) {
        a = head;
        b = 0;
    } else if (n <= 16) {
        a = head;
        b = read64(p + n - 8);
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
inline uint64_t hash_bytes(const uint8_t* p, size_t n) { return hash_bytes(p, n, head_word(p, n)); }

// Buffers of 1 MiB or more in whole 2 MiB pages, aligned to them and marked for transparent huge
// pages (Linux, where the system leaves them to madvise, its default): a lookup in a table of
// megabytes, which misses the cache anyway, then seldom misses the TLB too. With 4 KiB pages a
// core's TLB covers a few MiB, against the encoder's tens (the vocabulary's maps, each thread's
// caches). Smaller buffers come from the usual allocator.
template <class T>
struct HugePageAllocator {
    using value_type = T;
    static constexpr size_t kHugePage = size_t{2} << 20;
    static constexpr size_t kFrom = size_t{1} << 20;

    HugePageAllocator() = default;
    template <class U>
    HugePageAllocator(const HugePageAllocator<U>&) {}

    T* allocate(size_t n) {
        if (n > (SIZE_MAX - kHugePage) / sizeof(T)) throw std::bad_alloc();
        const size_t bytes = n * sizeof(T);
        if (bytes < kFrom) return std::allocator<T>().allocate(n);
        const size_t rounded = (bytes + kHugePage - 1) & ~(kHugePage - 1);
        void* p = std::aligned_alloc(kHugePage, rounded);
        if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        madvise(p, rounded, MADV_HUGEPAGE);  // a hint: no huge page to be had leaves 4 KiB ones
#endif
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t n) {
        if (n * sizeof(T) < kFrom) {
            std::allocator<T>().deallocate(p, n);
        } else {
            std::free(p);
        }
    }
    template <class U>
    bool operator==(const HugePageAllocator<U>&) const {
        return true;
    }
    template <class U>
    bool operator!=(const HugePageAllocator<U>&) const {
        return false;
    }
};
template <class T>
using BigVector = std::vector<T, HugePageAllocator<T>>;

// A byte string to look up, with its head word and hash computed once for any number of maps.
struct Key {
    const uint8_t* p;
    size_t n;
    uint64_t head;
    uint64_t hash;
    Key(const uint8_t* p_, size_t n_) : p(p_), n(n_), head(head_word(p_, n_)), hash(hash_bytes(p_, n_, head)) {}
    Key(const uint8_t* p_, size_t n_, uint64_t head_, uint64_t hash_) : p(p_), n(n_), head(head_), hash(hash_) {}
};

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

// Bytes appended a key at a time: a BytesMap's keys. (std::vector's insert at the end took three
// times the instructions of the copy itself, and new keys are most of what a new piece costs to
// keep.)
class Arena {
public:
    void clear() { size_ = 0; }
    size_t size() const { return size_; }
    const uint8_t* data() const { return buf_.get(); }
    void append(const uint8_t* p, size_t n) {
        if (cap_ - size_ < n) grow(n);
        if (n != 0) std::memcpy(buf_.get() + size_, p, n);
        size_ += n;
    }

private:
    void grow(size_t n) {
        const size_t cap = std::max(2 * cap_, std::max<size_t>(size_ + n, 4096));
        std::unique_ptr<uint8_t[]> bigger(new uint8_t[cap]);
        if (size_ != 0) std::memcpy(bigger.get(), buf_.get(), size_);
        buf_ = std::move(bigger);
        cap_ = cap;
    }

    std::unique_ptr<uint8_t[]> buf_;
    size_t size_ = 0, cap_ = 0;
};

template <class V>
class BytesMap {
public:
    struct Entry {
        uint64_t head;  // head_word of the key
        uint64_t off;
        uint32_t len;
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
    // Index in entries() of the entry whose value is v (a reference get_or_insert returned).
    size_t index_of(const V& v) const {
        return static_cast<size_t>(reinterpret_cast<const char*>(&v) -
                                   reinterpret_cast<const char*>(&entries_.front().value)) /
               sizeof(Entry);
    }

    // Value for the key, or nullptr. Lookups inline into the callers' loops; inserting does not.
    [[gnu::always_inline]] V* find(const Key& k) {
        size_t i;
        return probe(k, i);
    }
    [[gnu::always_inline]] const V* find(const Key& k) const { return const_cast<BytesMap*>(this)->find(k); }
    V* find(const uint8_t* p, size_t n) { return find(Key(p, n)); }
    const V* find(const uint8_t* p, size_t n) const { return find(Key(p, n)); }

    // The value for the key, or nullptr and in `slot` where insert_new would put it; the slot
    // holds until the map is changed (a caller that works out the value between the two steps
    // probes once).
    [[gnu::always_inline]] V* find(const Key& k, size_t& slot) { return probe(k, slot); }
    // Inserts a key that find(k, slot) did not find, at that slot, the map unchanged since.
    V& insert_new(size_t slot, const Key& k, const V& init) { return insert_at(slot, k, init); }

    // Reference to the value for the key, inserting `init` if absent.
    [[gnu::always_inline]] V& get_or_insert(const Key& k, const V& init, bool* inserted = nullptr) {
        size_t i;
        if (V* v = probe(k, i)) {
            if (inserted) *inserted = false;
            return *v;
        }
        if (inserted) *inserted = true;
        return insert_at(i, k, init);
    }
    V& get_or_insert(const uint8_t* p, size_t n, const V& init, bool* inserted = nullptr) {
        return get_or_insert(Key(p, n), init, inserted);
    }

private:
    struct Slot {
        uint32_t tag;
        uint32_t idx;  // entry index + 1; 0 = empty
    };

    // The key's value, or nullptr and in `i` the empty slot where it would go.
    [[gnu::always_inline]] V* probe(const Key& k, size_t& i) {
        const uint32_t tag = static_cast<uint32_t>(k.hash >> 32);
        for (i = tag & mask_;; i = (i + 1) & mask_) {
            const Slot s = slots_[i];
            if (s.idx == 0) return nullptr;
            if (s.tag == tag) {
                Entry& e = entries_[s.idx - 1];
                if (same_key(e, k)) return &e.value;
            }
        }
    }

    [[gnu::noinline]] V& insert_at(size_t i, const Key& k, const V& init) {
        if (k.n > 0xFFFFFFFFu) throw std::length_error("a key of 4 GiB or more");  // Entry::len is 32-bit
        const uint64_t off = arena_.size();
        arena_.append(k.p, k.n);
        entries_.push_back(Entry{k.head, off, static_cast<uint32_t>(k.n), init});
        slots_[i] = Slot{static_cast<uint32_t>(k.hash >> 32), static_cast<uint32_t>(entries_.size())};
        if (entries_.size() * 2 > slots_.size()) grow();
        return entries_.back().value;
    }

    bool same_key(const Entry& e, const Key& k) const {
        return e.len == k.n && e.head == k.head && (k.n <= 8 || bytes_equal(arena_.data() + e.off + 8, k.p + 8, k.n - 8));
    }

    // A key's slot is found from its tag (the hash's high half), so the slots move to the table
    // twice the size without reading a key or hashing one again.
    void grow() {
        const size_t cap = slots_.size() * 2;
        if (cap > (size_t{1} << 32)) throw std::length_error("a map of more than 2^31 keys");
        BigVector<Slot> old(cap, Slot{0, 0});
        old.swap(slots_);
        mask_ = cap - 1;
        for (const Slot& s : old) {
            if (s.idx == 0) continue;
            size_t i = s.tag & mask_;
            while (slots_[i].idx != 0) i = (i + 1) & mask_;
            slots_[i] = s;
        }
    }

    BigVector<Slot> slots_;
    std::vector<Entry> entries_;
    Arena arena_;
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
        BigVector<Slot> old;
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

    BigVector<Slot> slots_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

// (left id, right id) -> merged rank, keyed as left << 32 | right with that key's hash_u64 (the
// hash the caller has already computed for its filter). For ids and ranks below 2^21 (every
// vocabulary of up to two million tokens) a slot packs all three into 8 bytes, left << 42 |
// right << 21 | rank, half a U64Map slot: o200k's 446k pairs then take 8 MiB instead of 16, which
// the last-level cache holds far more of. 0 marks an empty slot (no pair is 0, 0 -> 0: a token
// is longer than each of its parts). Larger vocabularies keep a U64Map.
class PairMap {
public:
    static constexpr uint32_t kNone = 0xFFFFFFFFu;
    static constexpr unsigned kBits = 21;

    void reset(size_t expected, size_t id_limit) {
        packed_ = id_limit <= (size_t{1} << kBits);
        size_ = 0;
        if (!packed_) {
            slots_.clear();
            wide_.reset(expected);
            return;
        }
        size_t cap = 16;
        while (cap < expected * 2) cap <<= 1;
        slots_.assign(cap, 0);
        mask_ = cap - 1;
    }
    size_t size() const { return packed_ ? size_ : wide_.size(); }
    void prefetch(uint64_t key) const { prefetch_hashed(hash_u64(key)); }
    // h: hash_u64(key).
    void prefetch_hashed(uint64_t h) const {
        if (packed_) __builtin_prefetch(&slots_[h & mask_]);
    }
    // A key already present keeps its rank.
    void insert(uint64_t key, uint32_t rank) {
        if (!packed_) {
            wide_.get_or_insert(key, rank);
            return;
        }
        const uint64_t want = pack(key);
        size_t i = hash_u64(key) & mask_;
        for (; slots_[i] != 0; i = (i + 1) & mask_)
            if (slots_[i] >> kBits == want) return;
        slots_[i] = want << kBits | rank;
        ++size_;
    }
    // h: hash_u64(key).
    [[gnu::always_inline]] uint32_t find(uint64_t key, uint64_t h) const {
        if (!packed_) {
            const uint32_t* v = wide_.find(key);
            return v ? *v : kNone;
        }
        const uint64_t want = pack(key);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const uint64_t s = slots_[i];
            if (s == 0) return kNone;
            if (s >> kBits == want) return static_cast<uint32_t>(s) & ((uint32_t{1} << kBits) - 1);
        }
    }
    template <class F>
    void for_each(F&& f) const {
        if (!packed_) {
            wide_.for_each(f);
            return;
        }
        const uint64_t low = (uint64_t{1} << kBits) - 1;
        for (const uint64_t s : slots_)
            if (s != 0) f((s >> (2 * kBits)) << 32 | ((s >> kBits) & low), static_cast<uint32_t>(s & low));
    }

private:
    static uint64_t pack(uint64_t key) { return (key >> 32) << kBits | (key & 0xFFFFFFFFu); }

    bool packed_ = true;
    BigVector<uint64_t> slots_;
    uint64_t mask_ = 0;
    size_t size_ = 0;
    U64Map<uint32_t> wide_;
};

// Keys of up to 16 bytes -> a 32-bit value, each slot holding its whole key: (head_word, the
// last 8 bytes for keys of 9..16 bytes, length) identify the bytes, so a lookup compares in the
// slot and loads nothing else. A BytesMap reads a slot, then its entry, then for keys of more
// than 8 bytes the key's bytes: in a map of megabytes (a vocabulary), each of those a cache miss.
class ShortKeyMap {
public:
    static constexpr size_t kMaxKey = 16;

    void reset(size_t keys) {
        size_t cap = 16;
        while (cap < keys * 2) cap <<= 1;  // at most half full: short probes
        slots_.assign(cap, Slot{0, 0, 0, 0});
        mask_ = cap - 1;
    }
    // k.n <= kMaxKey; a key already present keeps its value.
    void insert(const Key& k, uint32_t value) {
        const uint64_t tail = tail_of(k);
        size_t i = index(k.hash);
        for (; slots_[i].len != 0; i = (i + 1) & mask_)
            if (slots_[i].len == k.n && slots_[i].head == k.head && slots_[i].tail == tail) return;
        slots_[i] = Slot{k.head, tail, static_cast<uint32_t>(k.n), value};
    }
    // The line find(k) reads first.
    void prefetch(const Key& k) const { __builtin_prefetch(&slots_[index(k.hash)]); }
    // k.n <= kMaxKey.
    [[gnu::always_inline]] const uint32_t* find(const Key& k) const {
        const uint64_t tail = tail_of(k);
        for (size_t i = index(k.hash);; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.len == k.n && s.head == k.head && s.tail == tail) return &s.value;
            if (s.len == 0) return nullptr;
        }
    }

private:
    struct alignas(32) Slot {
        uint64_t head;
        uint64_t tail;  // 0 for keys of <= 8 bytes
        uint32_t len;   // 0: empty
        uint32_t value;
    };
    static uint64_t tail_of(const Key& k) { return k.n > 8 ? detail::read64(k.p + k.n - 8) : 0; }
    // bits of the hash that neither BytesMap's slot index (the low ones) nor BloomFilter uses
    // (up to 2^24 slots: vocabularies have fewer than 2^22 tokens)
    size_t index(uint64_t h) const { return static_cast<size_t>(h >> 40) & mask_; }

    BigVector<Slot> slots_;
    uint64_t mask_ = 0;
};

// A Bloom filter of 64-bit hashes: ~8 bits per key, both probe bits of a key in one 64-bit word
// (one cache line read per query). "No" is certain; "maybe" is wrong for a few % of absent keys.
class BloomFilter {
public:
    void reset(size_t keys) {
        size_t words = 64;
        while (words * 64 < keys * 8) words <<= 1;
        words_.assign(words, 0);
        mask_ = words - 1;
    }
    void add(uint64_t h) { words_[word_of(h)] |= bits(h); }
    void prefetch(uint64_t h) const { __builtin_prefetch(&words_[word_of(h)]); }
    bool maybe(uint64_t h) const {
        const uint64_t b = bits(h);
        return (words_[word_of(h)] & b) == b;
    }

private:
    size_t word_of(uint64_t h) const { return static_cast<size_t>(h >> 12) & mask_; }
    static uint64_t bits(uint64_t h) { return (uint64_t{1} << (h & 63)) | (uint64_t{1} << ((h >> 6) & 63)); }
    std::vector<uint64_t> words_;
    uint64_t mask_ = 0;
};

}  // namespace tokcore
