// learn_merges, the fast way, with the reference's exact rules:
//
// * alphabet: the 256 bytes (byte-level BPE) or the symbols given (characters, an end-of-word
//   symbol), ids 0..n-1; merged tokens get the next ids;
// * words: the distinct pieces as flat int32 id arrays (merged in place), with counts;
// * pair stats: (left << 32 | right) -> PairInfo {weighted count, occurrences, words};
//   counted once up front, then updated incrementally: a merge touches only the words on
//   the merged pair's word list (a list that may hold stale or repeated entries; they are
//   skipped when used);
// * selection: a max-heap of (count, pair) ordered by count, ties by the smallest
//   (left bytes, right bytes). Entries are refreshed lazily: a popped entry whose count is
//   out of date is dropped (and re-pushed with the current count if that is lower; any
//   pair whose count grows gets a fresh entry when it grows), so the first up-to-date entry
//   popped is the reference's `min(stats, key=(-count, left bytes, right bytes))`.
// * a pair whose merged bytes already are a token reuses that token's id;
// * a pair whose merged bytes would be longer than max_token_bytes is never a candidate.
//
// * first-seen ties (optional): a second heap ordered by (count, first occurrence), the
//   first occurrence as one number: word id << 32 | byte offset from the block's original
//   start (block ids follow the pieces' order and a chain's order, so the number orders
//   occurrences as the text does). An entry's key is a lower bound of the pair's first
//   occurrence (an occurrence added in word w can be no earlier than w << 32; removals only
//   move it later); a popped entry is checked against the first occurrence found by
//   scanning its word list, and pushed again with it when it was low.
//
// "Occurrences" are tracked next to the weighted count so that a pair that only occurs in
// pieces of count 0 still exists for the reference (stats[pair] == 0 is a candidate).
//
// Long pieces: a merge rewrites every word on the pair's list, O(word length) each, so one
// 100 MB piece would cost 100 MB per merge. Pieces longer than kBlock symbols are therefore
// stored as a chain of blocks of at most kBlock symbols, each a word of its own (same
// count) linked to its neighbours; a pair across a boundary belongs to the block of its
// left symbol. A merge then rewrites only the blocks that hold the pair: O(kBlock) per
// occurrence whatever the piece's length.
#include "train.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cancel.h"
#include "hashing.h"

namespace tokcore {

namespace {

struct PairInfo {
    int64_t count = 0;  // sum of word counts over occurrences
    int64_t occ = 0;    // number of occurrences
    int32_t left = 0, right = 0;
    uint32_t touched = 0xFFFFFFFFu;  // merge step that last increased it
    std::vector<uint32_t> words;     // words that contain / contained it
};

struct HeapEntry {
    int64_t count;
    uint32_t pair;
};

struct KeyedEntry {
    int64_t count;
    uint32_t pair;
    uint64_t key;  // a lower bound of the pair's first occurrence (see first_seen_key)
};

constexpr uint32_t kBlock = 256;
constexpr uint32_t kNoWord = 0xFFFFFFFFu;

class Trainer {
public:
    Trainer(const TrainInput& in, int64_t min_frequency, size_t max_token_bytes, bool first_seen)
        : min_frequency_(min_frequency), max_token_bytes_(max_token_bytes ? max_token_bytes : SIZE_MAX), first_seen_(first_seen) {
        if (in.alphabet.empty()) {
            tokens_.reserve(256 + 1024);
            for (int b = 0; b < 256; ++b) add_symbol(std::string(1, static_cast<char>(b)));
            build_words(in, in.bytes.data());
        } else {
            tokens_.reserve(in.alphabet.size() + 1024);
            for (const std::string& t : in.alphabet) add_symbol(t);
            const int32_t n = static_cast<int32_t>(tokens_.size());
            for (const int32_t v : in.symbols)
                if (v < 0 || v >= n) throw std::invalid_argument("symbol " + std::to_string(v) + " is not in the alphabet");
            build_words(in, in.symbols.data());
        }
        if (first_seen_) shift_.assign(words_.size(), 0);
        count_pairs();
    }

    Merges run(size_t n_merges, const ProgressFn& progress, size_t every) {
        Merges result;
        std::vector<int32_t>& out = result.rows;
        out.reserve(std::min<size_t>(n_merges, 1 << 20) * 3);
        result.counts.reserve(std::min<size_t>(n_merges, 1 << 20));
        size_t done = 0, reported = 0;
        while (done < n_merges) {
            poll_.tick();
            const int64_t best = first_seen_ ? select_first_seen() : select();
            if (best < 0) break;
            if (pairs_[best].count < min_frequency_) break;
            const uint32_t pi = static_cast<uint32_t>(best);
            const int32_t a = pairs_[pi].left, b = pairs_[pi].right;
            const int32_t x = token_for(a, b);
            out.push_back(a);
            out.push_back(b);
            out.push_back(x);
            result.counts.push_back(pairs_[pi].count);
            apply(pi, a, b, x, static_cast<uint32_t>(done));
            ++done;
            if (progress && every && done % every == 0) {
                progress(done, n_merges);
                reported = done;
            }
        }
        if (progress && reported != done) progress(done, n_merges);
        return result;
    }

private:
    // ---- setup -----------------------------------------------------------------------
    void add_symbol(const std::string& t) {
        if (t.empty()) throw std::invalid_argument("an alphabet symbol has no bytes");
        bool inserted = false;
        id_of_.get_or_insert(reinterpret_cast<const uint8_t*>(t.data()), t.size(),
                             static_cast<int32_t>(tokens_.size()), &inserted);
        if (!inserted) throw std::invalid_argument("two alphabet symbols have the same bytes");
        tokens_.push_back(t);
    }

    // Strictly increasing byte pieces (PieceCounter.to_arrays order) cannot repeat.
    static bool strictly_sorted(const TrainInput& in) {
        if (!in.alphabet.empty()) return false;
        for (size_t k = 1; k < in.counts.size(); ++k) {
            const uint64_t a0 = in.offsets[k - 1], a1 = in.offsets[k], b1 = in.offsets[k + 1];
            const size_t la = a1 - a0, lb = b1 - a1, m = std::min(la, lb);
            const int c = m ? std::memcmp(in.bytes.data() + a0, in.bytes.data() + a1, m) : 0;
            if (c > 0 || (c == 0 && la >= lb)) return false;
        }
        return true;
    }

    // `data`: in.bytes or in.symbols, whichever holds the pieces.
    template <class T>
    void build_words(const TrainInput& in, const T* data) {
        const size_t np = in.counts.size();
        const bool unique = strictly_sorted(in);
        const size_t total = in.offsets.empty() ? 0 : in.offsets.back();
        BytesMap<uint32_t> seen(unique ? 16 : np / 2 + 16);
        sym_.reserve(total);
        words_.reserve(np + total / kBlock);
        for (size_t k = 0; k < np; ++k) {
            if (in.counts[k] < 0) throw std::invalid_argument("counts must be >= 0");
            const uint64_t b = in.offsets[k], e = in.offsets[k + 1];
            poll_.tick(e - b + 1);
            if (e - b < 2) continue;  // no pairs
            if (!unique) {
                bool inserted = false;
                uint32_t& w = seen.get_or_insert(reinterpret_cast<const uint8_t*>(data + b), (e - b) * sizeof(T),
                                                 static_cast<uint32_t>(words_.size()), &inserted);
                if (!inserted) {  // duplicate piece: the last count wins (in each of its blocks)
                    for (uint32_t v = w; v != kNoWord; v = words_[v].next) words_[v].freq = in.counts[k];
                    continue;
                }
            }
            if (words_.size() + (e - b) / kBlock + 1 >= kNoWord)
                throw std::invalid_argument("too many distinct pieces (at most 4294967294 words of 256 bytes)");
            uint32_t prev = kNoWord;
            for (uint64_t s = b; s < e; s += kBlock) {
                const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(kBlock, e - s));
                const uint32_t w = static_cast<uint32_t>(words_.size());
                words_.push_back(Word{sym_.size(), len, 0xFFFFFFFFu, in.counts[k], kNoWord, prev});
                if (prev != kNoWord) {
                    words_[prev].next = w;
                    chained_ = true;
                }
                prev = w;
                for (uint64_t i = s; i < s + len; ++i) sym_.push_back(static_cast<int32_t>(data[i]));
            }
        }
    }

    void count_pairs() {
        pair_index_.reset(words_.size() + 1024);
        for (uint32_t w = 0; w < words_.size(); ++w) {
            const Word& wd = words_[w];
            poll_.tick(wd.len);
            const int32_t* s = sym_.data() + wd.start;
            for (uint32_t i = 0; i + 1 < wd.len; ++i) add(s[i], s[i + 1], w, wd.freq, 0xFFFFFFFEu);
            if (wd.next != kNoWord) add(s[wd.len - 1], first_symbol(wd.next), w, wd.freq, 0xFFFFFFFEu);
        }
        touched_.clear();
        if (first_seen_) {
            keyed_.reserve(pairs_.size());
            for (uint32_t p = 0; p < pairs_.size(); ++p)
                if (pairs_[p].occ > 0 && !too_long(pairs_[p])) keyed_.push_back({pairs_[p].count, p, key_lb_[p]});
            std::make_heap(keyed_.begin(), keyed_.end(), KeyedLower{});
            return;
        }
        heap_.reserve(pairs_.size());
        for (uint32_t p = 0; p < pairs_.size(); ++p)
            if (pairs_[p].occ > 0 && !too_long(pairs_[p])) heap_.push_back({pairs_[p].count, p});
        std::make_heap(heap_.begin(), heap_.end(), Lower{this});
    }

    int32_t first_symbol(uint32_t w) const { return sym_[words_[w].start]; }
    int32_t last_symbol(uint32_t w) const { return sym_[words_[w].start + words_[w].len - 1]; }

    bool too_long(const PairInfo& P) const {
        return tokens_[P.left].size() + tokens_[P.right].size() > max_token_bytes_;
    }

    // ---- pair bookkeeping ------------------------------------------------------------
    uint32_t pair_id(int32_t l, int32_t r) {
        bool inserted = false;
        const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
        uint32_t& idx = pair_index_.get_or_insert(key, static_cast<uint32_t>(pairs_.size()), &inserted);
        if (inserted) {
            pairs_.emplace_back();
            pairs_.back().left = l;
            pairs_.back().right = r;
            if (first_seen_) key_lb_.push_back(UINT64_MAX);
        }
        return idx;
    }

    void add(int32_t l, int32_t r, uint32_t w, int64_t f, uint32_t step) {
        const uint32_t p = pair_id(l, r);
        PairInfo& P = pairs_[p];
        P.count += f;
        P.occ += 1;
        if (first_seen_) key_lb_[p] = std::min(key_lb_[p], static_cast<uint64_t>(w) << 32);
        if (P.words.empty() || P.words.back() != w) P.words.push_back(w);
        if (P.touched != step) {
            P.touched = step;
            touched_.push_back(p);
        }
    }

    void remove(int32_t l, int32_t r, int64_t f) {
        const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
        PairInfo& P = pairs_[*pair_index_.find(key)];
        P.count -= f;
        P.occ -= 1;
    }

    // ---- selection -------------------------------------------------------------------
    int compare_bytes(int32_t x, int32_t y) const {
        if (x == y) return 0;
        const std::string& a = tokens_[x];
        const std::string& b = tokens_[y];
        const size_t m = std::min(a.size(), b.size());
        const int c = m ? std::memcmp(a.data(), b.data(), m) : 0;
        if (c != 0) return c;
        return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
    }

    // Heap order: "lower priority than". Higher count wins; ties: smaller bytes win.
    struct Lower {
        const Trainer* t;
        bool operator()(const HeapEntry& u, const HeapEntry& v) const {
            if (u.count != v.count) return u.count < v.count;
            const PairInfo& pu = t->pairs_[u.pair];
            const PairInfo& pv = t->pairs_[v.pair];
            int c = t->compare_bytes(pu.left, pv.left);
            if (c == 0) c = t->compare_bytes(pu.right, pv.right);
            return c > 0;
        }
    };

    void push(const HeapEntry& e) {
        heap_.push_back(e);
        std::push_heap(heap_.begin(), heap_.end(), Lower{this});
    }
    void pop() {
        std::pop_heap(heap_.begin(), heap_.end(), Lower{this});
        heap_.pop_back();
    }

    // Best live pair (left on the heap), or -1 if no pair exists.
    int64_t select() {
        while (!heap_.empty()) {
            poll_.tick();
            const HeapEntry top = heap_.front();
            const PairInfo& P = pairs_[top.pair];
            if (P.occ == 0) {
                pop();
                continue;
            }
            if (top.count != P.count) {
                pop();
                if (P.count < top.count) push({P.count, top.pair});
                continue;
            }
            return top.pair;
        }
        return -1;
    }

    // Bytes from block w's original start to its first occurrence of (l, r) (the pair across
    // its end included), or -1 if it holds none.
    int64_t first_offset(uint32_t w, int32_t l, int32_t r) const {
        const Word& W = words_[w];
        const int32_t* s = sym_.data() + W.start;
        uint64_t off = shift_[w];
        for (uint32_t i = 0; i < W.len; ++i) {
            if (s[i] == l) {
                const bool pairs = i + 1 < W.len ? s[i + 1] == r : (W.next != kNoWord && first_symbol(W.next) == r);
                if (pairs) return static_cast<int64_t>(off);
            }
            off += tokens_[s[i]].size();
        }
        return -1;
    }

    // (word id, offset) of the pair's first occurrence, as one comparable number.
    uint64_t first_seen_key(uint32_t p) const {
        const PairInfo& P = pairs_[p];
        uint64_t best = UINT64_MAX;
        for (const uint32_t w : P.words) {
            if ((static_cast<uint64_t>(w) << 32) >= best) continue;
            const int64_t off = first_offset(w, P.left, P.right);
            if (off >= 0) best = std::min(best, (static_cast<uint64_t>(w) << 32) | static_cast<uint64_t>(off));
        }
        return best;
    }

    // Keyed heap order: higher count wins; ties: the earlier first occurrence wins.
    struct KeyedLower {
        bool operator()(const KeyedEntry& u, const KeyedEntry& v) const {
            if (u.count != v.count) return u.count < v.count;
            return u.key > v.key;
        }
    };
    void kpush(const KeyedEntry& e) {
        keyed_.push_back(e);
        std::push_heap(keyed_.begin(), keyed_.end(), KeyedLower{});
    }
    void kpop() {
        std::pop_heap(keyed_.begin(), keyed_.end(), KeyedLower{});
        keyed_.pop_back();
    }

    // select() with first-seen ties: the live pair of the top count met first.
    int64_t select_first_seen() {
        while (!keyed_.empty()) {
            poll_.tick();
            const KeyedEntry top = keyed_.front();
            const PairInfo& P = pairs_[top.pair];
            if (P.occ == 0) {
                kpop();
                continue;
            }
            if (top.count != P.count) {
                kpop();
                if (P.count < top.count) kpush({P.count, top.pair, key_lb_[top.pair]});
                continue;
            }
            const uint64_t key = first_seen_key(top.pair);
            if (key != top.key) {  // its first occurrence is later than the entry said
                kpop();
                key_lb_[top.pair] = key;
                kpush({P.count, top.pair, key});
                continue;
            }
            return top.pair;
        }
        return -1;
    }

    // ---- merging ---------------------------------------------------------------------
    int32_t token_for(int32_t a, int32_t b) {
        std::string merged = tokens_[a] + tokens_[b];
        bool inserted = false;
        int32_t& id = id_of_.get_or_insert(reinterpret_cast<const uint8_t*>(merged.data()), merged.size(),
                                          static_cast<int32_t>(tokens_.size()), &inserted);
        if (inserted) tokens_.push_back(std::move(merged));
        return id;
    }

    void apply(uint32_t pi, int32_t a, int32_t b, int32_t x, uint32_t step) {
        std::vector<uint32_t> words;
        words.swap(pairs_[pi].words);
        touched_.clear();
        // (a, a) overlaps itself ("aaa" -> x a): the blocks of one piece must be rewritten
        // left to right, as the reference scans a word. Block ids grow along a chain.
        if (a == b && chained_) std::sort(words.begin(), words.end());
        const size_t nw = words.size();
        for (size_t k = 0; k < nw; ++k) {
            // the word lists are mostly in increasing word order; fetch a little ahead
            if (k + 16 < nw) __builtin_prefetch(&words_[words[k + 16]]);
            if (k + 8 < nw) __builtin_prefetch(sym_.data() + words_[words[k + 8]].start);
            const uint32_t w = words[k];
            if (words_[w].stamp == step) continue;
            words_[w].stamp = step;
            poll_.tick(words_[w].len + 1);
            merge_word(w, a, b, x, step);
        }
        pairs_[pi].count = 0;  // every occurrence of the pair was merged
        pairs_[pi].occ = 0;
        for (uint32_t p : touched_) {
            const PairInfo& P = pairs_[p];
            if (P.occ > 0 && !too_long(P)) {
                if (first_seen_)
                    kpush({P.count, p, key_lb_[p]});
                else
                    push({P.count, p});
            }
        }
    }

    // Rewrite block w's occurrences of (a, b) as x, left to right, the pair across its end
    // included (b is then taken off the front of the next block).
    void merge_word(uint32_t w, int32_t a, int32_t b, int32_t x, uint32_t step) {
        Word& W = words_[w];
        int32_t* s = sym_.data() + W.start;
        const uint32_t n = W.len;
        // does the symbol at i (== a) pair with b?
        auto pairs_with_b = [&](uint32_t i) {
            return i + 1 < n ? s[i + 1] == b : (W.next != kNoWord && first_symbol(W.next) == b);
        };
        uint32_t i = 0;
        while (i < n && !(s[i] == a && pairs_with_b(i))) ++i;
        if (i >= n) return;  // stale entry
        const int64_t f = W.freq;
        uint32_t o = i;
        while (i < n) {
            if (!(s[i] == a && pairs_with_b(i))) {
                s[o++] = s[i++];
                continue;
            }
            // left neighbour: this block's output so far, else the previous block's end
            if (o > 0) {
                remove(s[o - 1], a, f);
                add(s[o - 1], x, w, f, step);
            } else if (W.prev != kNoWord) {
                const int32_t z = last_symbol(W.prev);
                remove(z, a, f);
                add(z, x, W.prev, f, step);
            }
            // (a, b) itself: all its occurrences go; apply() zeroes it at the end
            if (i + 1 < n) {
                i += 2;
            } else {
                take_first(W.next, w, b);
                i += 1;
            }
            // right neighbour: the symbol after b, here or at the next block's start
            const bool here = i < n;
            if (here || W.next != kNoWord) {
                const int32_t c = here ? s[i] : first_symbol(W.next);
                remove(b, c, f);
                add(x, c, w, f, step);
            }
            s[o++] = x;
        }
        W.len = o;
    }

    // Drop the first symbol of block v (w's successor); unlink v if it is left empty.
    void take_first(uint32_t v, uint32_t w, int32_t b) {
        Word& V = words_[v];
        if (first_seen_) shift_[v] += static_cast<uint32_t>(tokens_[b].size());
        ++V.start;
        if (--V.len > 0) return;
        words_[w].next = V.next;
        if (V.next != kNoWord) words_[V.next].prev = w;
        V.next = V.prev = kNoWord;
    }

    int64_t min_frequency_;
    size_t max_token_bytes_;
    cancel::Poll& poll_ = cancel::current();
    bool first_seen_;                  // ties: first occurrence, not smallest bytes
    std::vector<uint32_t> shift_;      // first-seen: bytes taken off each block's front
    std::vector<uint64_t> key_lb_;     // first-seen: a lower bound of each pair's first occurrence
    bool chained_ = false;             // some piece is longer than one block
    std::vector<std::string> tokens_;  // id -> bytes
    BytesMap<int32_t> id_of_;          // bytes -> id
    struct Word {
        uint64_t start;  // offset into sym_
        uint32_t len;    // current length (merges shrink words in place)
        uint32_t stamp;  // last merge step that visited the word
        int64_t freq;    // count
        uint32_t next;   // next / previous block of the same piece, or kNoWord
        uint32_t prev;
    };
    std::vector<int32_t> sym_;         // all words, flat
    std::vector<Word> words_;
    U64Map<uint32_t> pair_index_;      // (left, right) -> index into pairs_
    std::vector<PairInfo> pairs_;
    std::vector<HeapEntry> heap_;
    std::vector<KeyedEntry> keyed_;    // first-seen: the heap, keyed by first occurrence
    std::vector<uint32_t> touched_;
};

}  // namespace

Merges learn_merges(const TrainInput& input, size_t n_merges, int64_t min_frequency, const ProgressFn& progress,
                    size_t max_token_bytes, size_t progress_every, bool first_seen) {
    if (n_merges == 0) return {};
    Trainer t(input, min_frequency, max_token_bytes, first_seen);
    return t.run(n_merges, progress, progress_every);
}

}  // namespace tokcore
