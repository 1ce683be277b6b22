// Encoder: split text with a pattern, then byte-pair-encode each piece with a tiktoken-style
// vocabulary (token bytes -> rank, where the rank is also the token id).
//
// Per piece, exactly as bpe_reference.bpe_piece / tiktoken:
//   1. the whole piece is a token -> that token;
//   2. otherwise start from single bytes and repeatedly merge the adjacent pair whose
//      concatenation has the lowest rank (leftmost on ties) until no adjacent pair is a token.
// Parts are always tokens, so step 2 runs on ids with a (left id, right id) -> merged id map:
// every split of a token into two tokens (see the constructor: linear in the vocabulary's bytes).
//
// Character-level vocabularies (start_chars) start step 2 from the piece's UTF-8 characters
// instead of its bytes; that initial segmentation is the only difference. A character that is
// not a token becomes the `unknown` id, or, with no unknown id, its bytes' single-byte tokens
// (byte fallback).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hashing.h"

namespace tokcore {

// Per-thread caches of the encoder: piece -> ids for pieces that are not a single token
// (bounded), and the id (or "not a token") of recent short pieces. Aligned to a cache line, so
// that two threads' caches (allocated one after the other) never share one.
struct alignas(64) PieceCache {
    struct Span {
        uint32_t off;
        uint32_t len;
    };
    BytesMap<Span> map{1 << 12};
    std::vector<uint32_t> ids;

    // Direct-mapped by hash: (head word, length) -> id of a piece of <= 8 bytes, kNone if it is
    // not a token (its ids are in `map`).
    // 256 KiB stays in the core's L2 cache, where the vocabulary's tables (megabytes for 100k
    // tokens) do not, and most pieces of a text are one of its few thousand frequent words.
    struct Recent {
        uint64_t head;
        uint32_t len;  // 0: empty
        uint32_t id;   // 0xFFFFFFFF (EncoderCore::kNone): not a token
    };
    static constexpr size_t kRecent = 16384;

    // The same for pieces of 9..16 bytes, with their ids (up to kLongIds) in the entry: most
    // words of non-Latin scripts (2-3 bytes a letter) are that long, and many are not one token.
    // Without it each took a lookup in the vocabulary's tables, missing the cache, and those
    // that are no token another one in `map`.
    static constexpr size_t kLongIds = 3;
    struct RecentLong {
        uint64_t head;   // first 8 bytes
        uint64_t tail;   // last 8 bytes (they overlap head below 16 bytes)
        uint16_t len;    // 0: empty
        uint16_t count;  // ids in `ids`; 0: more than kLongIds, they are in `map`
        uint32_t ids[kLongIds];
    };
    static constexpr size_t kRecentLong = 16384;

    // Recent answers of EncoderCore::merged for the BPE of new pieces: the pairs of a script's
    // letters recur from word to word, while the vocabulary's pair map (tens of MB for o200k)
    // misses the cache on nearly every lookup. Direct-mapped; key ~0 (no pair of ids) is empty.
    struct PairMemo {
        uint64_t key;
        uint32_t rank;
    };
    static constexpr unsigned kPairMemoBits = 13;
    static constexpr size_t kPairMemo = size_t{1} << kPairMemoBits;

    // Pieces of <= 15 bytes (ASCII ones of the scanners; others of 2..15 bytes with 8 bytes
    // readable at their start): (first 8 bytes, last 8 bytes, length) -> their ids, keyed
    // by the bytes as loaded (a piece of < 8 bytes is its bytes zero-extended). Most pieces of
    // any text are one of these, and a hit costs a load, a multiply and a compare where the
    // general path hashes the piece (and, for a piece of other scripts, looked in the recent-piece
    // tables, which hold the ids of pieces of <= 8 bytes only when they are one token).
    // 32,768 entries (1 MiB): 2 MB of English holds tens of thousands of distinct words, and with
    // 8,192 entries a tenth of its pieces missed even on a second pass (a second pass over the
    // same text, o200k: 17-20% faster than with 8,192; 65,536 no faster than 32,768). Two ways a
    // set, the two entries of one cache line, the word met last first: direct-mapped, two words
    // of a text in one slot took it from each other at every meeting (a second pass over English
    // 12-15% faster with the two ways).
    // Up to kWordIds ids in the entry; a word of more (up to 15, one a byte) keeps them in
    // PieceCache::ids, the entry's ids[0] their offset there (a word of another script is often
    // more than three tokens, and each meeting of one looked in the token table and the piece map,
    // both missing the cache: multilingual text met again, o200k, 1.3-1.6x faster).
    static constexpr size_t kWordIds = 3;
    struct Word {
        uint64_t head;
        uint64_t tail;   // 0 for pieces of <= 8 bytes
        uint16_t len;    // 0: empty
        uint16_t count;  // its ids
        uint32_t ids[kWordIds];  // count > kWordIds: ids[0] is their offset in `ids`
    };
    static_assert(sizeof(Word) == 32);
    static constexpr unsigned kWordBits = 15;
    // Where a word's `count` ids are: in its entry, or in `ids`.
    const uint32_t* ids_of(const Word& w) const { return w.count > kWordIds ? ids.data() + w.ids[0] : w.ids; }

    // The words table's second level: every word of it met that is no token, until the cache is
    // emptied. Open addressing, at most half full; an entry is a Word, its whole key and its ids
    // (or their place in `ids`) in one 32-byte slot. A word looked up here costs one line fetched,
    // where `map` (which holds the other pieces) costs three: its slot, its entry, its key's bytes.
    class WordStore {
    public:
        WordStore() { reset(); }
        void reset() {
            slots_.assign(kInitial, Word{});
            mask_ = kInitial - 1;
            size_ = 0;
        }
        size_t size() const { return size_; }
        // The line find() reads first.
        void prefetch(uint64_t head, uint64_t tail, size_t len) const {
            __builtin_prefetch(&slots_[index(head, tail, len)]);
        }
        // The word's entry, or nullptr.
        const Word* find(uint64_t head, uint64_t tail, size_t len) const {
            for (size_t i = index(head, tail, len);; i = (i + 1) & mask_) {
                const Word& w = slots_[i];
                if (w.len == len && w.head == head && w.tail == tail) return &w;
                if (w.len == 0) return nullptr;
            }
        }
        // A word find() did not find.
        void insert(const Word& word) {
            if (2 * (size_ + 1) > slots_.size()) grow();
            place(word);
            ++size_;
        }

    private:
        static constexpr size_t kInitial = size_t{1} << 12;
        // Not the words table's slot (the top bits of a product of the key): the words that one
        // set of the table lost, which share those bits, would crowd the same run of slots here.
        size_t index(uint64_t head, uint64_t tail, size_t len) const {
            return static_cast<size_t>(hash_u64(head ^ (tail * 0x9E3779B97F4A7C15ull) ^ (uint64_t{len} << 59))) & mask_;
        }
        void place(const Word& word) {
            size_t i = index(word.head, word.tail, word.len);
            while (slots_[i].len != 0) i = (i + 1) & mask_;
            slots_[i] = word;
        }
        void grow() {
            BigVector<Word> old(2 * slots_.size(), Word{});
            old.swap(slots_);
            mask_ = slots_.size() - 1;
            for (const Word& w : old)
                if (w.len != 0) place(w);
        }
        BigVector<Word> slots_;
        size_t mask_ = 0;
        size_t size_ = 0;
    };
    WordStore word_store;

    // The four tables above in one buffer of 1.875 MiB: one huge page (BigVector), so that the
    // lookups of a piece met in the text cost no page walk (with the tables of the vocabulary in
    // such pages too: unseen English 4-9% faster, code 0-5%, multilingual o200k 2-5%).
    struct Tables {
        Word words[size_t{1} << kWordBits];
        RecentLong recent_long[kRecentLong];
        Recent recent[kRecent];
        PairMemo pair_memo[kPairMemo];
    };
    static_assert(sizeof(Tables) <= HugePageAllocator<Tables>::kHugePage);
    BigVector<Tables> tables = BigVector<Tables>(1);  // zeroed: slots of length 0 are empty
    PieceCache() {
        for (PairMemo& m : tables[0].pair_memo) m = PairMemo{~uint64_t{0}, 0};  // and memos of key ~0
    }
    Word* words() { return tables[0].words; }
    RecentLong* recent_long() { return tables[0].recent_long; }
    Recent* recent() { return tables[0].recent; }
    PairMemo* pair_memo() { return tables[0].pair_memo; }

    static constexpr size_t kMaxEntries = size_t{1} << 19;
    static constexpr size_t kMaxIds = size_t{1} << 23;
    static constexpr size_t kMaxPieceBytes = 256;

    // Empties `map`, `ids`, the word store and the words table (whose words of more than kWordIds
    // ids point into `ids`).
    void clear() {
        map.reset(1 << 12);
        ids.clear();
        word_store.reset();
        std::memset(static_cast<void*>(words()), 0, sizeof(Tables::words));
    }
};

// A str document of encode_batch holds a surrogate code point, which UTF-8 cannot hold.
struct SurrogateInText : std::runtime_error {
    SurrogateInText() : std::runtime_error("a surrogate code point in a str document") {}
};

// Limits on a vocabulary (pipeline_lib.tokenizer checks the same ones, with file names).
constexpr size_t kMaxVocabSize = size_t{1} << 22;   // ids are < this
constexpr size_t kMaxTokenBytes = size_t{1} << 20;  // longest token

// The ids of a batch (EncoderCore::encode_batch): appended to a vector when one thread encodes
// it; on several, each chunk's ids copied by the threads into a buffer made for them and left
// uninitialised (a vector would first zero it on the calling thread: one more serial pass over the
// whole output, which is what a batch's threads wait on at the end of a call).
class BatchIds {
public:
    const uint32_t* data() const { return placed_ ? place_ : buffer_ ? buffer_.get() : vector_.data(); }
    size_t size() const { return placed_ || buffer_ ? size_ : vector_.size(); }
    void clear() {
        vector_.clear();
        buffer_.reset();
        size_ = 0;
        placed_ = false;
    }
    // The one thread's ids go here.
    std::vector<uint32_t>& vector() { return vector_; }
    // allocate() gives `place` (room for `capacity` ids) where n fits: the caller's buffer, used
    // again from call to call, whose pages are in memory after the first (a new buffer's pages
    // were each a fault in every call, half the page faults of a file's encoding).
    void place_in(uint32_t* place, size_t capacity) {
        place_ = place;
        place_capacity_ = capacity;
    }
    // Whether the ids are in the place_in() buffer.
    bool placed() const { return placed_; }
    // Room for n ids, uninitialised.
    uint32_t* allocate(size_t n) {
        std::vector<uint32_t>().swap(vector_);
        size_ = n;
        if (place_ != nullptr && n <= place_capacity_) {
            buffer_.reset();
            placed_ = true;
            return place_;
        }
        placed_ = false;
        buffer_.reset(new uint32_t[std::max<size_t>(n, 1)]);
        return buffer_.get();
    }

private:
    std::vector<uint32_t> vector_;
    std::unique_ptr<uint32_t[]> buffer_;
    size_t size_ = 0;
    uint32_t* place_ = nullptr;
    size_t place_capacity_ = 0;
    bool placed_ = false;
};

class EncoderCore {
public:
    static constexpr uint32_t kNone = 0xFFFFFFFFu;

    // tokens[k] (bytes) has rank ranks[k]. Throws std::invalid_argument on a malformed
    // vocabulary (duplicate bytes or ranks, empty token, missing single byte, a rank
    // >= kMaxVocabSize, a token longer than kMaxTokenBytes). O(total token bytes).
    // start_chars: start BPE from characters (see above). Every single byte must be a token unless
    // start_chars with an `unknown` id.
    EncoderCore(const std::vector<std::string>& tokens, const std::vector<uint32_t>& ranks, int pattern,
                bool start_chars = false, uint32_t unknown = kNone);

    int pattern() const { return pattern_; }
    size_t vocab_size() const { return vocab_size_; }
    size_t token_count() const { return token_count_; }  // ordinary tokens (ranks), not counting gaps
    bool has_id(size_t id) const { return id < tok_len_.size() && tok_len_[id] != kNone; }

    // Append the ids of `data` (split + BPE) to `out`. Flattened: the vector's push_back and
    // whatever else the per-piece loop calls is inlined into it (the noinline helpers apart).
    [[gnu::flatten]] void encode(const uint8_t* data, size_t n, std::vector<uint32_t>& out, PieceCache* cache) const;
    // Append the ids of a single piece (whole-piece lookup, then BPE; no splitting).
    // periodic = false: never bpe_periodic (the tests compare the two).
    void encode_piece(const uint8_t* piece, size_t n, std::vector<uint32_t>& out, bool periodic = true) const;
    // The threads a call asking for `num_threads` gets: 0 means the hardware's concurrency.
    static size_t threads_for(int num_threads) {
        return num_threads > 0 ? static_cast<size_t>(num_threads)
                               : std::max<size_t>(1, std::thread::hardware_concurrency());
    }
    // Encode many documents with `num_threads` threads (threads_for).
    // ids are concatenated in document order; offsets has docs+1 cumulative entries.
    // kinds, when given, has one entry per document: 0, the document is lens[d] bytes of UTF-8;
    // 1, 2 or 4, it is lens[d] code units of a Python str of that many bytes each, converted to
    // UTF-8 by the thread that encodes it (utf8_units.h; throws SurrogateInText at a surrogate);
    // a long one is cut into pieces for the threads between its units (cut_units).
    void encode_batch(const std::vector<const uint8_t*>& docs, const std::vector<size_t>& lens, int num_threads,
                      BatchIds& ids, std::vector<uint64_t>& offsets, const std::vector<uint8_t>* kinds = nullptr);

    // The first offset past `from` at which data[0:n] may be cut, its two sides encoding to the
    // whole's ids; n when there is none. A cut follows a "\n" that a printable ASCII character
    // other than space follows ("/" excepted with o200k, whose punctuation pieces take the
    // newlines and slashes after them) and, with GPT-2's pattern, that one precedes. Never with
    // kNoSplit. The same cuts as pipeline_lib.tokenizer.core.safe_cuts, which says why.
    size_t safe_cut(const uint8_t* data, size_t n, size_t from) const;
    // data[0:n] cut at safe points into pieces of about `target` bytes, appended to ptrs/lens (a
    // stretch of no more than 2 x target, or with no safe point, stays one piece; an empty text is
    // one empty piece); returns how many.
    size_t cut_pieces(const uint8_t* data, size_t n, size_t target, std::vector<const uint8_t*>& ptrs,
                      std::vector<size_t>& lens) const;
    // The same for a Python str's n code units of `kind` bytes each (encode_batch's kinds): the
    // pieces' pointers and lengths are in units.
    size_t cut_units(const void* units, unsigned kind, size_t n, size_t target, std::vector<const uint8_t*>& ptrs,
                     std::vector<size_t>& lens) const;
    // The bytes of the chunks encode_batch hands its threads: about 1/8 of a thread's share of
    // `total_bytes` (a document counting 16 bytes more than its length), from 16 to 256 KiB.
    static size_t chunk_bytes(size_t total_bytes, size_t docs, size_t threads) {
        return std::clamp<size_t>((total_bytes + 16 * docs) / (8 * threads), size_t{1} << 14, size_t{1} << 18);
    }

    // Bytes of the ids; returns false and the index of the first unknown id on failure.
    bool decode(const uint32_t* ids, size_t m, std::string& out, size_t* bad_index) const;

    // Piece caches are pooled so that concurrent callers never share one.
    std::unique_ptr<PieceCache> acquire_cache();
    void release_cache(std::unique_ptr<PieceCache> cache);

private:
    [[gnu::noinline]] void encode_merged(const Key& key, std::vector<uint32_t>& out, PieceCache* cache) const;
    [[gnu::noinline]] void word_miss(const uint8_t* p, size_t len, uint64_t head, uint64_t tail, PieceCache::Word* w,
                                     std::vector<uint32_t>& out, PieceCache* cache) const;
    [[gnu::noinline]] void encode_long(const Key& key, std::vector<uint32_t>& out, PieceCache* cache) const;
    // slot: where the cache's map would hold the key (BytesMap::find; the map unchanged since).
    void cache_ids(const Key& key, size_t slot, const std::vector<uint32_t>& out, size_t before,
                   PieceCache* cache) const;
    // memo: the calling thread's cache, whose pair_memo the merges of short pieces go through.
    void bpe(const uint8_t* p, size_t n, std::vector<uint32_t>& out, bool periodic = true,
             PieceCache* memo = nullptr) const;
    // BPE of a long piece that repeats a unit of <= kMaxPeriod bytes, from the BPE of a window
    // and of its last bytes; false (nothing appended) when the shortcut does not apply.
    bool bpe_periodic(const uint8_t* p, size_t n, std::vector<uint32_t>& out) const;
    // Whether pure BPE of the bytes of tokens a, b gives back a, b (bpe-openai's "compatible").
    bool compatible(uint32_t a, uint32_t b) const;
    void bpe_chars(const uint8_t* p, size_t n, std::vector<uint32_t>& out) const;
    // BPE from n initial tokens: first(k) is token k, pair(k) the merged rank of tokens k, k + 1.
    template <class First, class Pair>
    void bpe_from(size_t n, First first, Pair pair, std::vector<uint32_t>& out, PieceCache* memo = nullptr) const;
    template <class First, class Pair>
    void bpe_small(size_t n, First first, Pair pair, std::vector<uint32_t>& out, PieceCache* memo) const;
    template <class Queue, class First, class Pair>
    void bpe_linked(size_t n, First first, Pair pair, Queue& queue, std::vector<uint32_t>& out,
                    PieceCache* memo) const;
    // Merged rank of two adjacent tokens, or kNone. Most lookups are either pairs of single
    // bytes (a direct table) or pairs that are not a token at all (rejected by a small
    // Bloom filter that stays in cache); the rest go to the hash map.
    uint32_t merged(uint32_t left, uint32_t right) const {
        const uint64_t key = (static_cast<uint64_t>(left) << 32) | right;
        return merged_key(key, hash_u64(key));
    }
    // The same through the calling thread's memo of recent pairs, when there is one.
    uint32_t merged(uint32_t left, uint32_t right, PieceCache* memo) const {
        if (memo == nullptr) return merged(left, right);
        const uint64_t key = (static_cast<uint64_t>(left) << 32) | right;
        // The memo's slot from one multiply (Fibonacci hashing). A third of the lookups of new
        // words of other scripts miss the memo, and then waited for the filter's word and the
        // map's slot one after the other: the filter's word is fetched with the memo's line, the
        // map's slot as soon as the memo has missed (docs/performance.md, eighteenth pass).
        PieceCache::PairMemo& m = memo->pair_memo()[(key * 0x9E3779B97F4A7C15ull) >> (64 - PieceCache::kPairMemoBits)];
        const uint64_t h = hash_u64(key);
        pair_filter_.prefetch(h);
        if (m.key == key) return m.rank;
        pairs_.prefetch_hashed(h);
        const uint32_t rank = merged_key(key, h);
        m = PieceCache::PairMemo{key, rank};
        return rank;
    }
    uint32_t merged_key(uint64_t key, uint64_t h) const {
        return pair_filter_.maybe(h) ? pairs_.find(key, h) : kNone;
    }
    // The lines token_of(k) reads, for a piece of <= ShortKeyMap::kMaxKey bytes.
    void prefetch_token(const Key& k) const {
        token_filter_.prefetch(k.hash);
        short_tokens_.prefetch(k);
    }
    // The rank of the piece if it is a token, else nullptr: tokens of up to 16 bytes from
    // short_tokens_ (one cache miss), longer ones from vocab_. Most pieces that reach this from
    // the encoder's caches are new ones that are no token (the BPE of a word not met before): the
    // filter, which stays in the L2 cache, answers for them first.
    const uint32_t* token_of(const Key& k) const {
        if (k.n > max_token_len_ || !token_filter_.maybe(k.hash)) return nullptr;
        return k.n <= ShortKeyMap::kMaxKey ? short_tokens_.find(k) : vocab_.find(k);
    }
    uint32_t merged_bytes(uint8_t left, uint8_t right) const {
        return byte_pairs_[(static_cast<uint32_t>(left) << 8) | right];
    }

    int pattern_;
    bool start_chars_ = false;
    uint32_t unknown_ = kNone;
    size_t vocab_size_ = 0;
    size_t token_count_ = 0;
    size_t max_token_len_ = 0;           // longer pieces skip the whole-piece lookup
    BytesMap<uint32_t> vocab_;           // token bytes -> rank
    ShortKeyMap short_tokens_;           // the tokens of <= 16 bytes again: one cache miss a lookup, not three
    BloomFilter token_filter_;           // of the tokens' hash_bytes (see token_of)
    PairMap pairs_;                      // (left << 32 | right) -> merged rank
    BloomFilter pair_filter_;            // of the keys of pairs_ (hash_u64)
    std::vector<uint32_t> byte_pairs_;   // (byte << 8 | byte) -> merged rank of the two byte tokens
    std::vector<uint64_t> tok_off_;      // by rank: offset into tok_bytes_
    std::vector<uint32_t> tok_len_;      // by rank: length, kNone = no such token
    std::string tok_bytes_;
    uint32_t byte_rank_[256];            // kNone: the byte is not a token (character-level vocabularies)

    std::mutex pool_mu_;
    std::vector<std::unique_ptr<PieceCache>> pool_;
};

}  // namespace tokcore
