// Python bindings of the compiled core: pipeline_lib._tokcore
//
// Everything long-running drops the GIL (nb::gil_scoped_release). Inputs handed to a
// GIL-free section are either immutable bytes objects the caller holds, or copied first.
//
// Long calls stay interruptible (cancel.h): each runs under a CallScope, which a
// cancel_all() stops, and which, for a call made on Python's main thread, runs Python's
// signal handlers every ~50 ms. A stopped call raises the handler's exception (e.g.
// KeyboardInterrupt) or pipeline_lib.errors.CancelledError.
//
// At interpreter exit (shutdown(), from pipeline_lib.cancel) running calls are stopped
// and given a moment to get back into Python: a thread that re-takes the GIL once
// finalization has begun is ended by Python 3.11 with pthread_exit, whose unwinding
// through C++ frames aborts the process ("terminate called without an active
// exception"). Daemon threads, and threads whose join() a signal interrupted (CPython
// then marks them stopped), are not waited for by the interpreter, hence the wait here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cancel.h"
#include "contains.h"
#include "counter.h"
#include "encode.h"
#include "pool.h"
#include "pretokenize.h"
#include "ranks_file.h"
#include "scan.h"
#include "sha256.h"
#include "train.h"
#include "utf8_units.h"

namespace nb = nanobind;
using namespace tokcore;

#ifndef TOKCORE_SOURCE_HASH
#error "TOKCORE_SOURCE_HASH (sha256 of the core's sources) is defined by CMakeLists.txt"
#endif

namespace {

// ---- cancellation ------------------------------------------------------------------------

unsigned long g_main_thread = 0;   // threading.main_thread().ident
std::atomic<int64_t> g_running{0};  // calls between CallScope creation and return
std::atomic<bool> g_shutdown{false};  // shutdown() ran: the process is going down

// Python runs signal handlers on the main thread only, and only when it gets there: a
// handler that raised leaves its exception set on this thread, and the call returns it.
bool check_signals() {
    nb::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0;
}

// Exit handlers run on the main thread and may still encode; after shutdown() other threads
// may not start a call.
bool on_main_thread() { return PyThread_get_thread_ident() == g_main_thread; }
void refuse_after_shutdown(bool main) {
    if (!main && g_shutdown.load()) throw Cancelled();
}

// Made with the GIL held, before the call releases it; destroyed with the GIL held again.
struct CallScope : cancel::Scope {
    CallScope() : CallScope(on_main_thread()) {}
    explicit CallScope(bool main) : cancel::Scope(main ? &check_signals : nullptr) {
        refuse_after_shutdown(main);
        g_running.fetch_add(1);
    }
    ~CallScope() { g_running.fetch_sub(1); }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;
};

void shutdown(double wait_s) {
    g_shutdown.store(true);
    cancel::cancel_all();
    nb::gil_scoped_release release;  // the stopped calls need the GIL to return
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    while (g_running.load() > 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// ---- helpers -----------------------------------------------------------------------------

void check_pattern(int pattern) {
    if (pattern < 0 || pattern >= kNumPatterns)
        throw nb::value_error(("unknown pattern id " + std::to_string(pattern) +
                               "; expected one of PATTERN_IDS.values() (0 gpt2, 1 cl100k, 2 o200k) or NO_SPLIT (3)")
                                  .c_str());
}

const uint8_t* bytes_ptr(const nb::bytes& b) { return reinterpret_cast<const uint8_t*>(b.c_str()); }

// A 1-d NumPy array that owns `v`.
template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> numpy_1d(std::vector<T>&& v) {
    auto* heap = new std::vector<T>(std::move(v));
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
    return nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner);
}

nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>> numpy_1d(BatchIds&& ids) {
    auto* heap = new BatchIds(std::move(ids));
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<BatchIds*>(p); });
    return nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>>(const_cast<uint32_t*>(heap->data()), {heap->size()}, owner);
}

// A batch's ids as a memoryview of uint32, no NumPy needed (the file command's blocks).
nb::ndarray<nb::memview, uint32_t, nb::ndim<1>> memview_1d(BatchIds&& ids) {
    auto* heap = new BatchIds(std::move(ids));
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<BatchIds*>(p); });
    return nb::ndarray<nb::memview, uint32_t, nb::ndim<1>>(const_cast<uint32_t*>(heap->data()), {heap->size()},
                                                           owner);
}

// Contiguous 1-d array of dtype `dtype` from any array-like (lists included), via NumPy.
template <class T>
nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu> as_array(nb::handle obj, const char* dtype,
                                                                        const char* what) {
    nb::module_ np = nb::module_::import_("numpy");
    nb::object arr = np.attr("ascontiguousarray")(obj, nb::arg("dtype") = dtype);
    if (nb::cast<int>(arr.attr("ndim")) != 1)
        throw nb::value_error((std::string(what) + " must be one-dimensional").c_str());
    return nb::cast<nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(arr);
}

// Pointers and lengths of a sequence of bytes objects; `keep` holds references to them so
// they stay alive while the GIL is released.
void collect_bytes(nb::handle seq, std::vector<nb::object>& keep, std::vector<const uint8_t*>& ptrs,
                   std::vector<size_t>& lens, const char* what) {
    nb::object fast = nb::steal(PySequence_Fast(seq.ptr(), "expected a sequence of bytes"));
    if (!fast.is_valid()) throw nb::python_error();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    keep.reserve(keep.size() + n);
    ptrs.reserve(ptrs.size() + n);
    lens.reserve(lens.size() + n);
    for (Py_ssize_t k = 0; k < n; ++k) {
        PyObject* it = items[k];
        if (!PyBytes_Check(it))
            throw nb::type_error((std::string(what) + "[" + std::to_string(k) + "] is not bytes").c_str());
        keep.push_back(nb::borrow(it));
        ptrs.push_back(reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(it)));
        lens.push_back(static_cast<size_t>(PyBytes_GET_SIZE(it)));
    }
}

nb::list bytes_list(const uint8_t* base, const std::vector<size_t>& ends) {
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(ends.size()));
    if (!list) throw nb::python_error();
    size_t b = 0;
    for (size_t k = 0; k < ends.size(); ++k) {
        PyObject* piece = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(base + b),
                                                    static_cast<Py_ssize_t>(ends[k] - b));
        if (!piece) {
            Py_DECREF(list);
            throw nb::python_error();
        }
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), piece);
        b = ends[k];
    }
    return nb::steal<nb::list>(list);
}

// ---- split -------------------------------------------------------------------------------

nb::list split_py(nb::bytes data, int pattern, bool ascii_first) {
    check_pattern(pattern);
    const uint8_t* p = bytes_ptr(data);
    const size_t n = data.size();
    std::vector<size_t> ends;
    CallScope scope;
    {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        cancel::Poll& poll = cancel::current();
        pretok::split_with(
            p, n, pattern,
            [&](size_t b, size_t e) {
                poll.tick(e - b);
                ends.push_back(e);
            },
            ascii_first);
    }
    return bytes_list(p, ends);
}

// ---- PieceCounter ------------------------------------------------------------------------

struct PieceCounter {
    explicit PieceCounter(int pattern) : core((check_pattern(pattern), pattern)) {}
    PieceCounterCore core;
    std::mutex mu;        // the GIL is released while counting; serialize concurrent calls
    bool broken = false;  // an add stopped half-way (read and written with the GIL held)
};

void check_not_broken(const PieceCounter& self) {
    if (self.broken)
        throw nb::value_error("this PieceCounter was interrupted in the middle of an add and holds partial "
                              "counts; count again with a new one");
}

// Runs `work` on the counter with the GIL released. An add that stops half-way (cancelled,
// out of memory) has counted part of its input, so the counter refuses further use
// rather than return partial counts.
template <class F>
void with_counter(PieceCounter& self, F&& work) {
    check_not_broken(self);
    CallScope scope;
    try {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        std::lock_guard<std::mutex> lock(self.mu);
        work();
    } catch (...) {
        self.broken = true;
        throw;
    }
}

void counter_add(PieceCounter& self, nb::bytes data) {
    const uint8_t* p = bytes_ptr(data);
    const size_t n = data.size();
    with_counter(self, [&] { self.core.add(p, n); });
}

void counter_add_batch(PieceCounter& self, nb::handle docs) {
    std::vector<nb::object> keep;
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    collect_bytes(docs, keep, ptrs, lens, "docs");
    with_counter(self, [&] {
        for (size_t k = 0; k < ptrs.size(); ++k) self.core.add(ptrs[k], lens[k]);
    });
}

void counter_add_counts(PieceCounter& self, nb::handle pieces, nb::handle counts_obj) {
    std::vector<nb::object> keep;
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    collect_bytes(pieces, keep, ptrs, lens, "pieces");
    auto counts = as_array<int64_t>(counts_obj, "int64", "counts");
    if (counts.shape(0) != ptrs.size()) throw nb::value_error("pieces and counts must have the same length");
    const int64_t* c = counts.data();
    with_counter(self, [&] {
        cancel::Poll& poll = cancel::current();
        for (size_t k = 0; k < ptrs.size(); ++k) {
            poll.tick(lens[k] + 1);
            self.core.add_count(ptrs[k], lens[k], c[k]);
        }
    });
}

nb::tuple counter_to_arrays(PieceCounter& self) {
    check_not_broken(self);
    std::vector<uint32_t> order;
    std::vector<int64_t> counts;
    CallScope scope;
    {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        std::lock_guard<std::mutex> lock(self.mu);
        order = self.core.sorted_order();
        counts.reserve(order.size());
        for (uint32_t k : order) counts.push_back(self.core.map().entries()[k].value);
    }
    std::lock_guard<std::mutex> lock(self.mu);  // uncontended unless another thread adds
    const auto& map = self.core.map();
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(order.size()));
    if (!list) throw nb::python_error();
    for (size_t i = 0; i < order.size(); ++i) {
        const auto& e = map.entries()[order[i]];
        PyObject* b = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(map.key_data(e)), e.len);
        if (!b) {
            Py_DECREF(list);
            throw nb::python_error();
        }
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), b);
    }
    return nb::make_tuple(nb::steal<nb::list>(list), numpy_1d(std::move(counts)));
}

// ---- learn_merges ------------------------------------------------------------------------

size_t max_bytes_of(nb::object max_token_bytes) {
    if (max_token_bytes.is_none()) return 0;  // no limit
    const int64_t m = nb::cast<int64_t>(max_token_bytes);
    if (m < 2) throw nb::value_error("max_token_bytes must be None or >= 2");
    return static_cast<size_t>(m);
}

std::vector<int64_t> counts_of(nb::handle counts_obj, size_t n_pieces) {
    auto counts = as_array<int64_t>(counts_obj, "int64", "counts");
    if (counts.shape(0) != n_pieces) throw nb::value_error("pieces and counts must have the same length");
    return std::vector<int64_t>(counts.data(), counts.data() + n_pieces);
}

bool first_seen_of(const std::string& ties) {
    if (ties == "bytes") return false;
    if (ties == "first-seen") return true;
    throw nb::value_error("ties must be 'bytes' or 'first-seen'");
}

Merges run_learn(const TrainInput& in, int64_t n_merges, int64_t min_frequency, nb::object progress, size_t max_bytes,
                 bool first_seen) {
    if (n_merges < 0) throw nb::value_error("n_merges must be >= 0");
    ProgressFn fn;
    if (!progress.is_none()) {
        fn = [&progress](size_t done, size_t total) {
            nb::gil_scoped_acquire acquire;
            progress(done, total);
        };
    }
    CallScope scope;
    try {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        return learn_merges(in, static_cast<size_t>(n_merges), min_frequency, fn, max_bytes, 1000, first_seen);
    } catch (const std::invalid_argument& e) {
        throw nb::value_error(e.what());
    }
}

nb::ndarray<nb::numpy, int32_t, nb::ndim<2>> rows_array(std::vector<int32_t>&& rows) {
    auto* heap = new std::vector<int32_t>(std::move(rows));
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
    return nb::ndarray<nb::numpy, int32_t, nb::ndim<2>>(heap->data(), {heap->size() / 3, size_t{3}}, owner);
}

nb::object learn_merges_py(nb::handle pieces, nb::handle counts_obj, int64_t n_merges, int64_t min_frequency,
                           nb::object progress, nb::object max_token_bytes, bool with_counts, const std::string& ties) {
    if (n_merges < 0) throw nb::value_error("n_merges must be >= 0");
    const size_t max_bytes = max_bytes_of(max_token_bytes);
    const bool first_seen = first_seen_of(ties);
    TrainInput in;
    {
        std::vector<nb::object> keep;
        std::vector<const uint8_t*> ptrs;
        std::vector<size_t> lens;
        collect_bytes(pieces, keep, ptrs, lens, "pieces");
        in.counts = counts_of(counts_obj, ptrs.size());
        size_t total = 0;
        for (size_t l : lens) total += l;
        in.bytes.resize(total);
        in.offsets.resize(ptrs.size() + 1);
        size_t off = 0;
        for (size_t k = 0; k < ptrs.size(); ++k) {
            in.offsets[k] = off;
            if (lens[k] != 0) std::memcpy(in.bytes.data() + off, ptrs[k], lens[k]);  // data() may be null
            off += lens[k];
        }
        in.offsets[ptrs.size()] = off;
    }
    Merges merges = run_learn(in, n_merges, min_frequency, progress, max_bytes, first_seen);
    nb::object rows = nb::cast(rows_array(std::move(merges.rows)));
    if (!with_counts) return rows;
    return nb::make_tuple(rows, numpy_1d(std::move(merges.counts)));
}

nb::tuple learn_symbol_merges_py(nb::handle alphabet, nb::handle symbols_obj, nb::handle offsets_obj,
                                 nb::handle counts_obj, int64_t n_merges, int64_t min_frequency, nb::object progress,
                                 nb::object max_token_bytes, const std::string& ties) {
    if (n_merges < 0) throw nb::value_error("n_merges must be >= 0");
    const size_t max_bytes = max_bytes_of(max_token_bytes);
    const bool first_seen = first_seen_of(ties);
    TrainInput in;
    {
        std::vector<nb::object> keep;
        std::vector<const uint8_t*> ptrs;
        std::vector<size_t> lens;
        collect_bytes(alphabet, keep, ptrs, lens, "alphabet");
        if (ptrs.empty()) throw nb::value_error("the alphabet is empty");
        for (size_t k = 0; k < ptrs.size(); ++k) in.alphabet.emplace_back(reinterpret_cast<const char*>(ptrs[k]), lens[k]);
    }
    auto symbols = as_array<int32_t>(symbols_obj, "int32", "symbols");
    auto offsets = as_array<int64_t>(offsets_obj, "int64", "offsets");
    const size_t n_pieces = offsets.shape(0) ? offsets.shape(0) - 1 : 0;
    in.symbols.assign(symbols.data(), symbols.data() + symbols.shape(0));
    in.offsets.resize(n_pieces + 1, 0);
    for (size_t k = 0; k <= n_pieces && offsets.shape(0); ++k) {
        const int64_t o = offsets.data()[k];
        if (o < 0 || static_cast<size_t>(o) > in.symbols.size() || (k > 0 && static_cast<uint64_t>(o) < in.offsets[k - 1]))
            throw nb::value_error("offsets must be non-decreasing indices into symbols");
        in.offsets[k] = static_cast<uint64_t>(o);
    }
    in.counts = counts_of(counts_obj, n_pieces);
    Merges merges = run_learn(in, n_merges, min_frequency, progress, max_bytes, first_seen);
    return nb::make_tuple(rows_array(std::move(merges.rows)), numpy_1d(std::move(merges.counts)));
}

// ---- Encoder -----------------------------------------------------------------------------

struct Encoder {
    std::unique_ptr<EncoderCore> core;
    // The Python int of each id a list output has held, made once: a list of ids then takes one
    // reference per element instead of one int allocation per element (ints above 256 are not
    // cached by Python). Changed only with the GIL held (fill_lists' helpers read it, and add to
    // the ints' reference counts, while the thread that called them holds the GIL).
    std::vector<PyObject*> id_objects;
    bool all_id_objects = false;  // id_objects holds every id of the vocabulary (fill_lists)
    // The threads one long text is encoded on (encode_ordinary, encode_ordinary_list); set by
    // pipeline_lib.tokenizer (TOKENMILL_NUM_THREADS), 1 for the core alone.
    int text_threads = 1;
    ~Encoder() {
        if (!Py_IsInitialized()) return;
        for (PyObject* o : id_objects) Py_XDECREF(o);
    }
};

constexpr size_t kMaxCachedIds = size_t{1} << 20;  // ids above this get an int object each time

// A new Python list of ids[0:n], built in one pass (the GIL held).
PyObject* ids_to_list(Encoder& self, const uint32_t* ids, size_t n) {
    if (self.id_objects.empty()) self.id_objects.assign(std::min(self.core->vocab_size(), kMaxCachedIds), nullptr);
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(n));
    if (!list) return nullptr;
    PyObject** items = reinterpret_cast<PyListObject*>(list)->ob_item;
    PyObject** table = self.id_objects.data();
    const size_t table_size = self.id_objects.size();
    for (size_t k = 0; k < n; ++k) {
        const uint32_t id = ids[k];
        PyObject* o;
        if (id < table_size) {
            o = table[id];
            if (o == nullptr) {
                o = PyLong_FromUnsignedLong(id);
                if (!o) {
                    Py_DECREF(list);
                    return nullptr;
                }
                table[id] = o;
            }
            Py_INCREF(o);
        } else {
            o = PyLong_FromUnsignedLong(id);
            if (!o) {
                Py_DECREF(list);
                return nullptr;
            }
        }
        items[k] = o;
    }
    return list;
}

// Python's cyclic garbage collector paused while a call makes many lists (the GIL held): each
// collection that their allocations start (one per 700 under Python 3.11) walks every young list
// made so far, which took a quarter of a batch of 10,000 lists. The collector's count stays, so a
// collection follows the call at the next allocation if the lists are still alive then.
class GcPause {
public:
    GcPause() : was_enabled_(PyGC_Disable()) {}
    ~GcPause() {
        if (was_enabled_) PyGC_Enable();
    }
    GcPause(const GcPause&) = delete;
    GcPause& operator=(const GcPause&) = delete;

private:
    int was_enabled_;
};

// Whether fill_lists may fill `n` ids' lists on `threads` threads.
bool fill_in_parallel(const Encoder& self, size_t n, size_t threads) {
#ifdef Py_GIL_DISABLED
    return false;  // reference counts are not plain fields there
#else
    return threads > 1 && n >= (size_t{1} << 16) && self.core->vocab_size() <= kMaxCachedIds;
#endif
}

// lists[d] (new, its items NULL) gets the ints of ids[offsets[d]:offsets[d + 1]], on `threads`
// threads (fill_in_parallel). Lists made on the calling thread alone left the other threads
// idle: a batch of lists ran at 2x one thread on 16 cores where the same batch to NumPy ran at
// 7x. The GIL stays held, so no Python code runs while the helpers write the lists' items and,
// once all are written, add each int's references in one step (per-thread counts summed by id
// range): the ints are the encoder's, made for every id of the vocabulary before the first fill.
// Nothing can fail once the helpers start.
void fill_lists(Encoder& self, const uint32_t* ids, const uint64_t* offsets, PyObject* const* lists,
                size_t n_lists, size_t threads) {
    const size_t vocab = self.core->vocab_size();
    if (!self.all_id_objects) {
        self.id_objects.resize(vocab, nullptr);
        for (size_t id = 0; id < vocab; ++id) {
            if (self.id_objects[id] != nullptr) continue;
            if (!(self.id_objects[id] = PyLong_FromSize_t(id))) throw nb::python_error();
        }
        self.all_id_objects = true;
    }
    PyObject* const* table = self.id_objects.data();
    const size_t n = offsets[n_lists];
    constexpr size_t kUnitIds = size_t{1} << 16;
    const size_t units = (n + kUnitIds - 1) / kUnitIds;
    threads = std::min(threads, units);
    struct FreeDeleter {
        void operator()(uint32_t* p) const { std::free(p); }
    };
    // calloc: the pages are zeroed as each thread first touches them, not here
    std::vector<std::unique_ptr<uint32_t[], FreeDeleter>> counts(threads);
    for (auto& c : counts) {
        c.reset(static_cast<uint32_t*>(std::calloc(vocab, sizeof(uint32_t))));
        if (!c) throw std::bad_alloc();
    }
    std::vector<char> ran(threads, 0);  // slots that a thread took (run() drops the others)
    std::atomic<size_t> next{0};
    HelperPool::get().run(threads - 1, [&](size_t slot) {
        ran[slot] = 1;
        uint32_t* count = counts[slot].get();
        for (size_t u; (u = next.fetch_add(1)) < units;) {
            const uint64_t a = u * kUnitIds, b = std::min<uint64_t>(a + kUnitIds, n);
            size_t d = static_cast<size_t>(std::upper_bound(offsets, offsets + n_lists + 1, a) - offsets) - 1;
            for (uint64_t k = a; k < b; ++d) {
                const uint64_t first = offsets[d], end = std::min<uint64_t>(offsets[d + 1], b);
                PyObject** items = reinterpret_cast<PyListObject*>(lists[d])->ob_item;
                for (; k < end; ++k) {
                    const uint32_t id = ids[k];
                    items[k - first] = table[id];
                    ++count[id];
                }
            }
        }
    });
    constexpr size_t kUnitRanks = size_t{1} << 14;
    const size_t rank_units = (vocab + kUnitRanks - 1) / kUnitRanks;
    next.store(0);
    HelperPool::get().run(threads - 1, [&](size_t) {
        for (size_t u; (u = next.fetch_add(1)) < rank_units;) {
            const size_t end = std::min(vocab, (u + 1) * kUnitRanks);
            for (size_t id = u * kUnitRanks; id < end; ++id) {
                size_t refs = 0;
                for (size_t t = 0; t < threads; ++t)
                    if (ran[t]) refs += counts[t][id];
                if (refs != 0) Py_SET_REFCNT(table[id], Py_REFCNT(table[id]) + static_cast<Py_ssize_t>(refs));
            }
        }
    });
}

// One new list of ids[0:n] (the GIL held), filled on `threads` threads when it is long.
nb::object list_of_ids(Encoder& self, const uint32_t* ids, size_t n, size_t threads) {
    if (!fill_in_parallel(self, n, threads)) {
        PyObject* list = ids_to_list(self, ids, n);
        if (!list) throw nb::python_error();
        return nb::steal(list);
    }
    nb::object list = nb::steal(PyList_New(static_cast<Py_ssize_t>(n)));
    if (!list.is_valid()) throw nb::python_error();
    const uint64_t offsets[2] = {0, n};
    PyObject* const lists[1] = {list.ptr()};
    fill_lists(self, ids, offsets, lists, 1, threads);
    return list;
}

// A list of ints as uint32 values without NumPy (Tokenizer passes its ranks so: `get_encoding`
// and `encode` import no NumPy); anything else through numpy.ascontiguousarray.
std::vector<uint32_t> uint32_values(nb::handle obj, const char* what) {
    if (!PyList_Check(obj.ptr())) {
        auto arr = as_array<uint32_t>(obj, "uint32", what);
        return std::vector<uint32_t>(arr.data(), arr.data() + arr.shape(0));
    }
    const Py_ssize_t n = PyList_GET_SIZE(obj.ptr());
    std::vector<uint32_t> values(static_cast<size_t>(n));
    for (Py_ssize_t k = 0; k < n; ++k) {
        PyObject* item = PyList_GET_ITEM(obj.ptr(), k);
        if (!PyLong_Check(item) || PyBool_Check(item))
            throw nb::type_error((std::string(what) + " must be ints").c_str());
        const unsigned long long v = PyLong_AsUnsignedLongLong(item);
        if (PyErr_Occurred() || v > UINT32_MAX) {
            PyErr_Clear();
            throw nb::value_error((std::string(what) + " must be in [0, 2**32)").c_str());
        }
        values[static_cast<size_t>(k)] = static_cast<uint32_t>(v);
    }
    return values;
}

// Constructs the Encoder at `self` (nanobind's memory for it) with the GIL released; a
// vocabulary the core refuses is a ValueError, and leaves `self` unconstructed.
void construct_encoder(Encoder* self, const std::vector<std::string>& tokens, const std::vector<uint32_t>& ranks,
                       int pattern, bool start_chars, uint32_t unknown_id) {
    CallScope scope;
    new (self) Encoder();
    try {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        self->core = std::make_unique<EncoderCore>(tokens, ranks, pattern, start_chars, unknown_id);
    } catch (const std::invalid_argument& e) {
        self->~Encoder();
        throw nb::value_error(e.what());
    } catch (...) {
        self->~Encoder();
        throw;
    }
}

void encoder_init(Encoder* self, nb::handle tokens, nb::handle ranks_obj, int pattern, bool start_chars,
                  nb::object unknown) {
    check_pattern(pattern);
    uint32_t unknown_id = EncoderCore::kNone;
    if (!unknown.is_none()) {
        const int64_t u = nb::cast<int64_t>(unknown);
        if (u < 0 || u >= static_cast<int64_t>(kMaxVocabSize)) throw nb::value_error("unknown id out of range");
        unknown_id = static_cast<uint32_t>(u);
    }
    std::vector<nb::object> keep;
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    collect_bytes(tokens, keep, ptrs, lens, "tokens");
    std::vector<uint32_t> rk = uint32_values(ranks_obj, "ranks");
    if (rk.size() != ptrs.size()) throw nb::value_error("tokens and ranks must have the same length");
    std::vector<std::string> toks(ptrs.size());
    for (size_t k = 0; k < ptrs.size(); ++k) toks[k].assign(reinterpret_cast<const char*>(ptrs[k]), lens[k]);
    construct_encoder(self, toks, rk, pattern, start_chars, unknown_id);
}

// A text of this many bytes or more is encoded on the encoder's text threads. Each thread has its
// caches, so a word of the text that both threads meet is learned twice: on new text, two threads
// took 1.04-1.33x the CPU time of one for texts of 512 KiB (1.29-1.76x faster; English, Python and
// multilingual text, bench_threads.py --texts), and 1.45x for 300 KB of English (1.29x faster).
constexpr size_t kThreadedTextBytes = size_t{1} << 19;

// A long text cut at safe points (EncoderCore::safe_cut) into segments that encode_batch hands to
// the encoder's text threads, as it would documents; false (nothing cut) when the text is short,
// has no safe point, or the encoder has one text thread.
bool text_segments(const Encoder& self, const uint8_t* p, size_t n, std::vector<const uint8_t*>& ptrs,
                   std::vector<size_t>& lens) {
    const size_t threads = static_cast<size_t>(std::max(self.text_threads, 1));
    if (threads == 1 || n < kThreadedTextBytes) return false;
    // segments of encode_batch's chunk size, so that each one is a chunk of its own
    return self.core->cut_pieces(p, n, EncoderCore::chunk_bytes(n, 1, threads), ptrs, lens) > 1;
}

// Whether a str is non-ASCII and keeps no UTF-8: the core may make its UTF-8 (MadeUtf8, or a
// batch's threads, BatchTexts), which the str then does not keep.
bool utf8_not_kept(PyObject* t) {
#ifdef Py_GIL_DISABLED
    (void)t;
    return false;  // a str's fields are not read without its lock there
#else
    return PyUnicode_Check(t) && !PyUnicode_IS_ASCII(t) && PyUnicode_IS_COMPACT(t) &&
           reinterpret_cast<PyCompactUnicodeObject*>(t)->utf8 == nullptr;
#endif
}

// The UTF-8 of such a str, made for a call that encodes one text by the core's conversion
// (utf8_units.h): 2-3x the speed of CPython's on other scripts, 5x on English whose str is of
// 2-byte units for a curly quote or a dash now and then, where CPython's took a tenth of the
// time of encoding the text. Up to 4 KiB on the stack, longer in a buffer of the call's sized for
// the units' worst case (so up to kMadeUtf8Bytes of it; CPython converts longer strs).
class MadeUtf8 {
public:
    static constexpr size_t kMadeUtf8Bytes = size_t{1} << 26;
    // t's UTF-8, here; {nullptr, 0} when t is too long or holds a surrogate (UTF-8 has none).
    std::pair<const uint8_t*, size_t> make(PyObject* t) {
        const unsigned kind = PyUnicode_KIND(t);
        const size_t units = static_cast<size_t>(PyUnicode_GET_LENGTH(t));
        const size_t need = units * utf8_bytes_per_unit(kind);
        if (need > kMadeUtf8Bytes) return {nullptr, 0};
        uint8_t* buffer = stack_;
        if (need > sizeof stack_) {
            heap_.reset(new uint8_t[need]);
            buffer = heap_.get();
        }
        const size_t n = utf8_from_units(PyUnicode_DATA(t), units, kind, buffer);
        if (n == SIZE_MAX) return {nullptr, 0};
        return {buffer, n};
    }

private:
    uint8_t stack_[4096];
    std::unique_ptr<uint8_t[]> heap_;
};

// UTF-8 of a str or the bytes of a bytes object, kept alive by `keep` (and `made`). An ASCII str
// is read in place, and so is the UTF-8 a str keeps; another str's UTF-8 is made in `made` when
// one is given, else by CPython, and kept by the str (as tiktoken's reading of a str does). A str
// with lone surrogates raises UnicodeEncodeError (the Python caller replaces them as tiktoken does).
std::pair<const uint8_t*, size_t> text_bytes(nb::handle text, nb::object& keep, MadeUtf8* made = nullptr) {
    PyObject* t = text.ptr();
    if (PyBytes_Check(t)) return {reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(t)), size_t(PyBytes_GET_SIZE(t))};
    if (!PyUnicode_Check(t)) throw nb::type_error("text must be str or bytes");
    if (PyUnicode_IS_ASCII(t))
        return {static_cast<const uint8_t*>(PyUnicode_DATA(t)), size_t(PyUnicode_GET_LENGTH(t))};
    if (made != nullptr && utf8_not_kept(t)) {
        const auto bytes = made->make(t);
        if (bytes.first != nullptr) return bytes;
    }
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(t, &size);
    if (utf8 == nullptr) throw nb::python_error();
    keep = nb::borrow(text);
    return {reinterpret_cast<const uint8_t*>(utf8), size_t(size)};
}

// encode_batch (the GIL released) of documents of which some are strs' code units (`kinds`); when
// one holds a surrogate, CPython is asked for the UTF-8 of `strs` (those strs), and raises the
// UnicodeEncodeError it raises there (which sends the Python caller down tiktoken's replacement).
void encode_units(Encoder& self, const std::vector<const uint8_t*>& ptrs, const std::vector<size_t>& lens,
                  const std::vector<uint8_t>* kinds, int num_threads, const std::vector<PyObject*>& strs, BatchIds& ids,
                  std::vector<uint64_t>& offsets) {
    CallScope scope;
    try {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        self.core->encode_batch(ptrs, lens, num_threads, ids, offsets, kinds);
    } catch (const SurrogateInText&) {
        for (PyObject* t : strs) {
            Py_ssize_t size = 0;
            if (PyUnicode_AsUTF8AndSize(t, &size) == nullptr) throw nb::python_error();
        }
        throw;
    }
}

// `unless`: the text an encoding call returns None for instead of encoding (the special tokens'
// common prefix, which Python then looks for the tokens behind), in the forms it is looked for in:
// UTF-8, and the code points that a str's units are compared with, made at the first such
// comparison of a call (most calls read UTF-8 alone, and a short text's call paid an allocation).
class Unless {
public:
    // None: nothing to look for (std::nullopt).
    static std::optional<Unless> of(nb::handle unless) {
        if (unless.is_none()) return std::nullopt;
        if (!PyUnicode_Check(unless.ptr())) throw nb::type_error("unless must be a str or None");
        Py_ssize_t size = 0;
        const char* utf8 = PyUnicode_AsUTF8AndSize(unless.ptr(), &size);
        if (utf8 == nullptr) throw nb::python_error();
        return Unless(unless.ptr(), std::string_view(utf8, static_cast<size_t>(size)));
    }
    // In UTF-8 (or bytes).
    bool in_bytes(const uint8_t* p, size_t n) const { return contains_bytes(p, n, utf8_); }
    // In n code units of `kind` bytes each (a str's, read in place by the text threads).
    bool in_units(const void* data, size_t n, unsigned kind) const {
        if (!units_made_) make_units();
        switch (kind) {
            case PyUnicode_1BYTE_KIND:
                return latin1_fits_ && contains_bytes(static_cast<const uint8_t*>(data), n, latin1_);
            case PyUnicode_2BYTE_KIND:
                return contains_units(static_cast<const uint16_t*>(data), n, points_.data(), points_.size());
            default:
                return contains_units(static_cast<const uint32_t*>(data), n, points_.data(), points_.size());
        }
    }

private:
    Unless(PyObject* str, std::string_view utf8) : str_(str), utf8_(utf8) {}
    void make_units() const {
        const Py_ssize_t m = PyUnicode_GET_LENGTH(str_);
        for (Py_ssize_t k = 0; k < m; ++k) {
            const uint32_t c = PyUnicode_READ_CHAR(str_, k);
            points_.push_back(c);
            latin1_fits_ = latin1_fits_ && c <= 0xFF;
            if (latin1_fits_) latin1_.push_back(static_cast<char>(c));
        }
        units_made_ = true;
    }

    PyObject* str_;          // borrowed: the caller's argument, alive for the call
    std::string_view utf8_;  // kept by the str
    mutable std::vector<uint32_t> points_;
    mutable std::string latin1_;  // the code points as bytes, when each fits one (latin1_fits_)
    mutable bool latin1_fits_ = true;
    mutable bool units_made_ = false;
};

// The documents of a batch as encode_batch takes them. A bytes object or an ASCII str is read in
// place, and so is the UTF-8 another str already keeps. The UTF-8 of the other strs is left to the
// batch's threads (kinds), each making that of the documents (or pieces of a long one) it
// encodes: made here, under the GIL, it was a pass of one thread over all the batch's new
// non-ASCII text before any thread could start (16 ms of a 10 MB multilingual batch that took
// 80-100 ms on two threads), and on one thread CPython's conversion is the slower one (MadeUtf8).
// Made by the threads, it is not kept by the str: a batch of the same strs again converts them
// again, on its threads.
struct BatchTexts {
    // A reference to every document: the caller's list is not copied, and a Python thread that
    // empties it while the GIL is released must not free a document the threads are reading.
    std::vector<nb::object> keep;
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    std::vector<uint8_t> kinds;  // empty when every document is UTF-8 already
    std::vector<PyObject*> strs;  // the strs left to the threads

    BatchTexts(PyObject* const* items, size_t n, const char* what) : keep(n), ptrs(n), lens(n) {
        for (size_t k = 0; k < n; ++k) {
            PyObject* t = items[k];
            if (!PyBytes_Check(t) && !PyUnicode_Check(t))
                throw nb::type_error((std::string(what) + "[" + std::to_string(k) + "] is not bytes or str").c_str());
            keep[k] = nb::borrow(t);
            if (utf8_not_kept(t)) {
                if (kinds.empty()) kinds.assign(n, 0);
                kinds[k] = static_cast<uint8_t>(PyUnicode_KIND(t));
                ptrs[k] = static_cast<const uint8_t*>(PyUnicode_DATA(t));
                lens[k] = static_cast<size_t>(PyUnicode_GET_LENGTH(t));
                strs.push_back(t);
                continue;
            }
            nb::object kept;
            std::tie(ptrs[k], lens[k]) = text_bytes(t, kept);
        }
    }

    // Whether a document holds `unless`.
    bool hold(const Unless& unless) const {
        for (size_t k = 0; k < ptrs.size(); ++k) {
            const bool held = kinds.empty() || kinds[k] == 0 ? unless.in_bytes(ptrs[k], lens[k])
                                                             : unless.in_units(ptrs[k], lens[k], kinds[k]);
            if (held) return true;
        }
        return false;
    }

    // Encoded on `num_threads` threads (encode_units).
    void encode(Encoder& self, int num_threads, BatchIds& ids, std::vector<uint64_t>& offsets) {
        encode_units(self, ptrs, lens, kinds.empty() ? nullptr : &kinds, num_threads, strs, ids, offsets);
    }
};

// Whether a text goes to the encoder's text threads as a str's code units, each thread making the
// UTF-8 of the pieces it encodes (encode_batch cuts it between its units as text_segments cuts
// UTF-8): a str as utf8_not_kept and as long as text_segments asks, its bytes counted as
// units x their size.
bool str_to_text_threads(const Encoder& self, PyObject* t) {
    return self.text_threads > 1 && utf8_not_kept(t) &&
           static_cast<size_t>(PyUnicode_GET_LENGTH(t)) * PyUnicode_KIND(t) >= kThreadedTextBytes;
}

// A str (str_to_text_threads) as the one document of encode_units' arguments.
struct StrDocument {
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    std::vector<uint8_t> kinds;
    std::vector<PyObject*> strs;
    explicit StrDocument(PyObject* t)
        : ptrs{static_cast<const uint8_t*>(PyUnicode_DATA(t))},
          lens{static_cast<size_t>(PyUnicode_GET_LENGTH(t))},
          kinds{static_cast<uint8_t>(PyUnicode_KIND(t))},
          strs{t} {}

    // Whether the str holds `unless`.
    bool holds(const Unless& unless) const { return unless.in_units(ptrs[0], lens[0], kinds[0]); }

    // Encoded on the encoder's text threads (encode_units).
    void encode(Encoder& self, BatchIds& ids) const {
        std::vector<uint64_t> offsets;
        encode_units(self, ptrs, lens, &kinds, self.text_threads, strs, ids, offsets);
    }
};

nb::object encoder_encode(Encoder& self, nb::handle data, nb::handle unless_obj) {
    const std::optional<Unless> unless = Unless::of(unless_obj);
    BatchIds out;
    if (str_to_text_threads(self, data.ptr())) {
        const StrDocument doc(data.ptr());
        if (unless && doc.holds(*unless)) return nb::none();
        doc.encode(self, out);
        return nb::cast(numpy_1d(std::move(out)));
    }
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    nb::object keep;
    MadeUtf8 made;
    const auto [p, n] = text_bytes(data, keep, &made);
    if (unless && unless->in_bytes(p, n)) return nb::none();
    const bool threaded = text_segments(self, p, n, ptrs, lens);
    CallScope scope;
    {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        if (threaded) {
            std::vector<uint64_t> offsets;
            self.core->encode_batch(ptrs, lens, self.text_threads, out, offsets);
        } else {
            out.vector().reserve(n / 4 + 16);
            auto cache = self.core->acquire_cache();
            self.core->encode(p, n, out.vector(), cache.get());
            self.core->release_cache(std::move(cache));
        }
    }
    return nb::cast(numpy_1d(std::move(out)));
}

// The documents at `ptrs`/`lens` encoded on `num_threads` threads (GIL released): (flat ids, offsets).
nb::tuple encode_documents(Encoder& self, const std::vector<const uint8_t*>& ptrs, const std::vector<size_t>& lens, int num_threads) {
    BatchIds ids;
    std::vector<uint64_t> offsets;
    encode_units(self, ptrs, lens, nullptr, num_threads, {}, ids, offsets);
    return nb::make_tuple(numpy_1d(std::move(ids)), numpy_1d(std::move(offsets)));
}

nb::tuple encoder_encode_batch(Encoder& self, nb::handle docs, int num_threads) {
    std::vector<nb::object> keep;
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    collect_bytes(docs, keep, ptrs, lens, "docs");
    return encode_documents(self, ptrs, lens, num_threads);
}

// Documents as bytes or str: an ASCII str is read in place, so a batch of text needs no
// serial UTF-8 pass before the threads start.
nb::tuple encoder_encode_texts(Encoder& self, nb::handle docs, int num_threads) {
    nb::object fast = nb::steal(PySequence_Fast(docs.ptr(), "expected a sequence of bytes or str"));
    if (!fast.is_valid()) throw nb::python_error();
    const size_t n_docs = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    BatchTexts texts(items, n_docs, "docs");
    BatchIds ids;
    std::vector<uint64_t> offsets;
    texts.encode(self, num_threads, ids, offsets);
    return nb::make_tuple(numpy_1d(std::move(ids)), numpy_1d(std::move(offsets)));
}

// The ids of a text's segments (text_segments), encoded and put in one list on the text threads.
nb::object segments_to_list(Encoder& self, const std::vector<const uint8_t*>& ptrs, const std::vector<size_t>& lens) {
    BatchIds ids;
    std::vector<uint64_t> offsets;
    encode_units(self, ptrs, lens, nullptr, self.text_threads, {}, ids, offsets);
    return list_of_ids(self, ids.data(), ids.size(), EncoderCore::threads_for(self.text_threads));
}

// tiktoken's encode_ordinary: a list of Python ints straight from the core's ids.
nb::object encoder_encode_list(Encoder& self, nb::handle text, nb::handle unless_obj) {
    const std::optional<Unless> unless = Unless::of(unless_obj);
    if (str_to_text_threads(self, text.ptr())) {
        const StrDocument doc(text.ptr());
        if (unless && doc.holds(*unless)) return nb::none();
        BatchIds ids;
        doc.encode(self, ids);
        return list_of_ids(self, ids.data(), ids.size(), EncoderCore::threads_for(self.text_threads));
    }
    nb::object keep;
    MadeUtf8 made;
    const auto [p, n] = text_bytes(text, keep, &made);
    if (unless && unless->in_bytes(p, n)) return nb::none();
    if (n < 4096) {
        // A short text (a chat message, a paragraph): microseconds under the GIL, so no
        // cancellation scope (its clock read and counters cost a tenth of encoding a sentence) and
        // no GIL round trip, and the ids go through this thread's scratch vector, not a new one.
        refuse_after_shutdown(on_main_thread());  // as CallScope does
        thread_local std::vector<uint32_t> scratch;
        scratch.clear();
        auto cache = self.core->acquire_cache();
        self.core->encode(p, n, scratch, cache.get());
        self.core->release_cache(std::move(cache));
        return list_of_ids(self, scratch.data(), scratch.size(), 1);
    }
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    if (text_segments(self, p, n, ptrs, lens)) return segments_to_list(self, ptrs, lens);
    std::vector<uint32_t> out;
    out.reserve(n / 4 + 16);
    CallScope scope;
    auto cache = self.core->acquire_cache();
    {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        self.core->encode(p, n, out, cache.get());
    }
    self.core->release_cache(std::move(cache));
    return list_of_ids(self, out.data(), out.size(), 1);
}

// tiktoken's encode_ordinary_batch: one list of ints per text, encoded and filled on `num_threads` threads.
nb::object encoder_encode_batch_lists(Encoder& self, nb::handle texts, int num_threads, nb::handle unless_obj) {
    const std::optional<Unless> unless = Unless::of(unless_obj);
    nb::object fast = nb::steal(PySequence_Fast(texts.ptr(), "expected a sequence of str or bytes"));
    if (!fast.is_valid()) throw nb::python_error();
    const size_t n_docs = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    BatchTexts batch(items, n_docs, "texts");
    if (unless && batch.hold(*unless)) return nb::none();
    BatchIds ids;
    std::vector<uint64_t> offsets;
    batch.encode(self, num_threads, ids, offsets);
    GcPause pause;
    nb::object outer = nb::steal(PyList_New(static_cast<Py_ssize_t>(n_docs)));
    if (!outer.is_valid()) throw nb::python_error();
    PyObject** docs = reinterpret_cast<PyListObject*>(outer.ptr())->ob_item;
    const size_t threads = EncoderCore::threads_for(num_threads);
    const bool parallel = fill_in_parallel(self, ids.size(), threads);
    for (size_t k = 0; k < n_docs; ++k) {
        const size_t count = offsets[k + 1] - offsets[k];
        docs[k] = parallel ? PyList_New(static_cast<Py_ssize_t>(count)) : ids_to_list(self, ids.data() + offsets[k], count);
        if (!docs[k]) throw nb::python_error();  // `outer` frees the lists made so far
    }
    if (parallel) fill_lists(self, ids.data(), offsets.data(), docs, n_docs, threads);
    return outer;
}

nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>> encoder_encode_piece(Encoder& self, nb::bytes piece, bool periodic) {
    const uint8_t* p = bytes_ptr(piece);
    const size_t n = piece.size();
    std::vector<uint32_t> out;
    CallScope scope;
    {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        self.core->encode_piece(p, n, out, periodic);
    }
    return numpy_1d(std::move(out));
}

nb::bytes encoder_decode(Encoder& self, nb::handle ids_obj) {
    // uint32 arrays decode directly; any other integer array-like is range-checked first so
    // that e.g. -1 or 2**32 + 5 is reported instead of wrapping around.
    nb::module_ np = nb::module_::import_("numpy");
    nb::object arr = np.attr("asarray")(ids_obj);
    if (nb::cast<int>(arr.attr("ndim")) != 1) throw nb::value_error("ids must be one-dimensional");
    const size_t m = nb::cast<size_t>(arr.attr("size"));
    std::vector<uint32_t> converted;
    nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> ids;
    const uint32_t* data = nullptr;
    if (arr.attr("dtype").equal(np.attr("uint32"))) {
        ids = as_array<uint32_t>(arr, "uint32", "ids");
        data = ids.data();
    } else if (m > 0) {
        const std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
        if (kind != "i" && kind != "u") throw nb::type_error("ids must be integers");
        auto wide = as_array<int64_t>(np.attr("clip")(arr, -1, int64_t{1} << 40), "int64", "ids");
        converted.resize(m);
        for (size_t k = 0; k < m; ++k) {
            const int64_t v = wide.data()[k];
            if (v < 0 || v >= static_cast<int64_t>(self.core->vocab_size())) {
                nb::object orig = arr[nb::int_(k)];
                throw nb::value_error(("invalid token id " + nb::cast<std::string>(nb::str(orig)) +
                                       " at position " + std::to_string(k) + " (vocab_size " +
                                       std::to_string(self.core->vocab_size()) + ")")
                                          .c_str());
            }
            converted[k] = static_cast<uint32_t>(v);
        }
        data = converted.data();
    }
    std::string out;
    size_t bad = 0;
    bool ok = true;
    if (m > 0) {
        nb::gil_scoped_release release;
        ok = self.core->decode(data, m, out, &bad);
    }
    if (!ok)
        throw nb::value_error(("invalid token id " + std::to_string(data[bad]) + " at position " +
                               std::to_string(bad) + " (vocab_size " + std::to_string(self.core->vocab_size()) +
                               ")")
                                  .c_str());
    return nb::bytes(out.data(), out.size());
}

// ---- documents as (buffer, offsets) ------------------------------------------------------
// Document k is data[offsets[k]:offsets[k + 1]]: one buffer for a whole batch (an Arrow
// string column's, zero copy) instead of one bytes object per document.

// A read-only view of an object with the buffer protocol (bytes, memoryview, a uint8 NumPy
// array), held until destroyed (with the GIL): the object stays alive and cannot be resized,
// so offsets checked against its size stay in bounds while the GIL is released (a mutable
// buffer that another thread writes meanwhile gives meaningless results, nothing worse).
class ByteView {
public:
    // flags = PyBUF_WRITABLE: a buffer to write into (writable_data); `refused`: the TypeError
    // where obj has no such buffer.
    explicit ByteView(nb::handle obj, int flags = PyBUF_SIMPLE,
                      const char* refused = "data must be a contiguous bytes-like object (bytes, memoryview, "
                                            "uint8 array)") {
        if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
            PyErr_Clear();
            throw nb::type_error(refused);
        }
    }
    ~ByteView() { PyBuffer_Release(&view_); }
    ByteView(const ByteView&) = delete;
    ByteView& operator=(const ByteView&) = delete;

    const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
    uint8_t* writable_data() const { return static_cast<uint8_t*>(view_.buf); }  // PyBUF_WRITABLE's
    size_t size() const { return static_cast<size_t>(view_.len); }

private:
    Py_buffer view_;
};

// The lines of a ranks file's bytes (parse_rank_lines), the GIL released; false where a line is
// not one.
bool parse_ranks_file(nb::handle data_obj, std::string& bytes, std::vector<RankLine>& lines) {
    ByteView data(data_obj);
    nb::gil_scoped_release release;
    lines.reserve(data.size() / 12);
    return parse_rank_lines(data.data(), data.size(), bytes, lines);
}

// An Encoder made from a tiktoken ranks file's bytes, parsed here (parse_ranks' rules) with the
// GIL released: no Python object per token (building {token: rank} and handing its keys to
// encoder_init took twice as long as the encoder's own build for cl100k). None where
// parse_ranks would give None: the caller then parses the file in Python, which names the bad
// line.
nb::object encoder_from_ranks_file(nb::handle data_obj, int pattern) {
    check_pattern(pattern);
    std::string bytes;
    std::vector<RankLine> lines;
    if (!parse_ranks_file(data_obj, bytes, lines)) return nb::none();
    std::vector<std::string> tokens;
    std::vector<uint32_t> ranks;
    tokens.reserve(lines.size());
    ranks.reserve(lines.size());
    for (const RankLine& line : lines) {
        tokens.emplace_back(bytes.data() + line.token_off, line.token_len);
        ranks.push_back(line.rank);
    }
    nb::object made = nb::inst_alloc(nb::type<Encoder>());
    construct_encoder(nb::inst_ptr<Encoder>(made), tokens, ranks, pattern, false, EncoderCore::kNone);
    nb::inst_mark_ready(made);
    return made;
}

// Offsets of documents in a buffer of `size` bytes, checked: at least one entry, non-decreasing,
// within the buffer. `what` names them in the errors.
void check_doc_offsets(const int64_t* o, size_t n, size_t size, const std::string& what) {
    if (n == 0) throw nb::value_error((what + " must hold len(documents) + 1 entries, at least one").c_str());
    if (o[0] < 0)
        throw nb::value_error((what + "[0] is " + std::to_string(o[0]) + ": " + what + " must be >= 0").c_str());
    for (size_t k = 1; k < n; ++k)
        if (o[k] < o[k - 1])
            throw nb::value_error((what + " must be non-decreasing: " + what + "[" + std::to_string(k) + "] = " +
                                   std::to_string(o[k]) + " < " + what + "[" + std::to_string(k - 1) +
                                   "] = " + std::to_string(o[k - 1]))
                                      .c_str());
    if (static_cast<uint64_t>(o[n - 1]) > size)
        throw nb::value_error((what + "[-1] = " + std::to_string(o[n - 1]) + " is past the end of data (" +
                               std::to_string(size) + " bytes)")
                                  .c_str());
}

// Offsets of documents in a buffer of `size` bytes, checked (check_doc_offsets): integers,
// one-dimensional.
nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> doc_offsets(nb::handle obj, size_t size) {
    nb::module_ np = nb::module_::import_("numpy");
    nb::object arr = np.attr("asarray")(obj);
    if (nb::cast<int>(arr.attr("ndim")) != 1) throw nb::value_error("offsets must be one-dimensional");
    if (nb::cast<size_t>(arr.attr("size")) == 0) check_doc_offsets(nullptr, 0, size, "offsets");  // before its dtype
    const std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
    if (kind != "i" && kind != "u") throw nb::type_error("offsets must be an array of integers");
    auto off = as_array<int64_t>(arr, "int64", "offsets");
    check_doc_offsets(off.data(), off.shape(0), size, "offsets");
    return off;
}

// Documents data[o[k]:o[k + 1]] of a buffer as pointers and lengths.
void buffer_documents(const ByteView& data, const int64_t* o, size_t n_docs, std::vector<const uint8_t*>& ptrs,
                      std::vector<size_t>& lens) {
    ptrs.resize(n_docs);
    lens.resize(n_docs);
    for (size_t k = 0; k < n_docs; ++k) {
        ptrs[k] = data.data() + o[k];
        lens[k] = static_cast<size_t>(o[k + 1] - o[k]);
    }
}

void counter_add_buffer(PieceCounter& self, nb::handle data_obj, nb::handle offsets_obj) {
    ByteView data(data_obj);
    auto off = doc_offsets(offsets_obj, data.size());
    const uint8_t* base = data.data();
    const int64_t* o = off.data();
    const size_t n_docs = off.shape(0) - 1;
    with_counter(self, [&] {
        for (size_t k = 0; k < n_docs; ++k) self.core.add(base + o[k], static_cast<size_t>(o[k + 1] - o[k]));
    });
}

nb::tuple encoder_encode_buffer(Encoder& self, nb::handle data_obj, nb::handle offsets_obj, int num_threads) {
    ByteView data(data_obj);
    auto off = doc_offsets(offsets_obj, data.size());
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    buffer_documents(data, off.data(), off.shape(0) - 1, ptrs, lens);
    return encode_documents(self, ptrs, lens, num_threads);
}

// encode_ordinary_buffer's ids alone, its documents' bounds a list of ints: the file command's
// call, whose blocks' ids go to the file as they are, with no NumPy to import. Where `out` (a
// writable buffer) has room for them, the ids are written at its start and the memoryview is of
// `out`: the command's two buffers, taken in turn.
nb::object encoder_encode_buffer_ids(Encoder& self, nb::handle data_obj, nb::handle bounds_obj, int num_threads,
                                     nb::handle out) {
    ByteView data(data_obj);
    std::optional<ByteView> place;
    if (!out.is_none()) place.emplace(out, PyBUF_WRITABLE, "out must be a writable contiguous buffer");
    if (!PyList_Check(bounds_obj.ptr())) throw nb::type_error("bounds must be a list of ints");
    const size_t n = static_cast<size_t>(PyList_GET_SIZE(bounds_obj.ptr()));
    std::vector<int64_t> bounds(n);
    for (size_t k = 0; k < n; ++k) {
        PyObject* item = PyList_GET_ITEM(bounds_obj.ptr(), static_cast<Py_ssize_t>(k));
        const long long v = PyLong_Check(item) ? PyLong_AsLongLong(item) : -1;
        if (!PyLong_Check(item) || PyErr_Occurred()) {
            PyErr_Clear();
            throw nb::value_error(("bounds[" + std::to_string(k) + "] is not an int of 64 bits").c_str());
        }
        bounds[k] = static_cast<int64_t>(v);
    }
    check_doc_offsets(bounds.data(), n, data.size(), "bounds");
    std::vector<const uint8_t*> ptrs;
    std::vector<size_t> lens;
    buffer_documents(data, bounds.data(), n - 1, ptrs, lens);
    BatchIds ids;
    const bool room = place && reinterpret_cast<uintptr_t>(place->data()) % alignof(uint32_t) == 0;
    const size_t capacity = room ? place->size() / sizeof(uint32_t) : 0;
    if (room) ids.place_in(reinterpret_cast<uint32_t*>(place->writable_data()), capacity);
    std::vector<uint64_t> offsets;
    encode_units(self, ptrs, lens, nullptr, num_threads, {}, ids, offsets);
    if (!ids.placed() && (!room || ids.size() > capacity)) return nb::cast(memview_1d(std::move(ids)));
    if (!ids.placed())  // one thread's ids, made in a vector of their own
        std::memcpy(place->writable_data(), ids.data(), ids.size() * sizeof(uint32_t));
    nb::object view = nb::steal(PyMemoryView_FromObject(out.ptr()));
    if (!view.is_valid()) throw nb::python_error();
    const size_t n_bytes = ids.size() * sizeof(uint32_t);
    return view.attr("cast")("B")[nb::slice(nb::int_(0), nb::int_(n_bytes), nb::none())].attr("cast")("I");
}

nb::bytes sha256_documents(nb::handle data_obj, nb::handle offsets_obj, bool portable) {
    ByteView data(data_obj);
    auto off = doc_offsets(offsets_obj, data.size());
    const int64_t* o = off.data();
    const size_t n_docs = off.shape(0) - 1;
    PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(32 * n_docs));
    if (!out) throw nb::python_error();
    nb::bytes digests = nb::steal<nb::bytes>(out);
    auto* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out));
    const sha256::CompressFn compress = portable ? &sha256::compress_portable : sha256::compress_fn();
    CallScope scope;
    {
        nb::gil_scoped_release release;
        cancel::Bind bind(&scope, true);
        cancel::Poll& poll = cancel::current();
        for (size_t k = 0; k < n_docs; ++k) {
            const size_t n = static_cast<size_t>(o[k + 1] - o[k]);
            poll.tick(n + 64);
            sha256::digest(data.data() + o[k], n, dst + 32 * k, compress);
        }
    }
    return digests;
}

}  // namespace

NB_MODULE(_tokcore, m) {
    m.doc() = "tokenmill compiled core: pre-tokenize, count, learn BPE merges, encode/decode.";
    // sha256 over the core's source files and CMakeLists.txt, computed by CMake at build time
    m.attr("CORE_SOURCE_HASH") = TOKCORE_SOURCE_HASH;
    m.attr("MAX_VOCAB_SIZE") = kMaxVocabSize;
    m.attr("MAX_TOKEN_BYTES") = kMaxTokenBytes;

    g_main_thread = nb::cast<unsigned long>(nb::module_::import_("threading").attr("main_thread")().attr("ident"));
    // Threads the interpreter abandons at exit (daemon threads, threads whose join() a signal
    // interrupted) still hold our objects then; nanobind would report those as leaks.
    nb::set_leak_warnings(false);
    nb::object cancelled = nb::module_::import_("pipeline_lib.errors").attr("CancelledError");
    nb::register_exception_translator(
        [](const std::exception_ptr& p, void* payload) {
            try {
                std::rethrow_exception(p);
            } catch (const Cancelled&) {
                if (!PyErr_Occurred())  // else a signal handler's exception is already set: keep it
                    PyErr_SetString(static_cast<PyObject*>(payload),
                                    "native call cancelled (cancel_all(): Ctrl-C, SIGTERM or interpreter exit)");
            }
        },
        cancelled.release().ptr());
    m.def("cancel_all", &cancel::cancel_all,
          "Stop every native call now running, in any thread (each raises CancelledError, or the exception "
          "of the signal handler that stopped it); calls started afterwards run normally.");
    m.def("shutdown", &shutdown, nb::arg("wait_s") = 0.0,
          "For a process going down: cancel_all(), make later calls from threads other than the main one "
          "raise CancelledError at once, and wait up to wait_s for the running calls to return.");
    nb::dict ids;
    ids["gpt2"] = static_cast<int>(kGpt2);
    ids["cl100k"] = static_cast<int>(kCl100k);
    ids["o200k"] = static_cast<int>(kO200k);
    m.attr("PATTERN_IDS") = ids;
    m.attr("NO_SPLIT") = static_cast<int>(kNoSplit);

    // scan_documents: plain-text documents of a block of bytes (pipeline_lib.corpus), GIL released
    m.def(
        "scan_documents",
        [](nb::handle data, int mode, bool final, bool in_place) {
            if (mode != kScanLine && mode != kScanParagraph)
                throw nb::value_error("mode must be 0 (line) or 1 (paragraph)");
            Py_buffer view;
            if (PyObject_GetBuffer(data.ptr(), &view, in_place ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0)
                throw nb::python_error();
            std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> held(&view, PyBuffer_Release);
            const size_t n = static_cast<size_t>(view.len);
            uint8_t* input = static_cast<uint8_t*>(view.buf);
            std::unique_ptr<uint8_t[]> packed(in_place ? nullptr : new uint8_t[n + 1]);  // uninitialized
            ScanResult r;
            CallScope scope;
            {
                nb::gil_scoped_release release;
                cancel::Bind bind(&scope, true);
                r = scan_documents(input, n, mode, final, in_place ? input : packed.get());
            }
            held.reset();
            nb::object packed_array = nb::none();
            if (!in_place) {
                uint8_t* raw = packed.release();
                nb::capsule owner(raw, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
                packed_array = nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(raw, {r.packed_size}, owner));
            }
            return nb::make_tuple(packed_array, numpy_1d(std::move(r.offsets)), numpy_1d(std::move(r.ends)),
                                  r.consumed, r.lines, r.chars, r.empty, numpy_1d(std::move(r.invalid)),
                                  numpy_1d(std::move(r.invalid_lines)));
        },
        nb::arg("data"), nb::arg("mode"), nb::arg("final"), nb::arg("in_place") = false,
        "Line (mode 0) or paragraph (mode 1) documents of a block of bytes (any buffer), as "
        "pipeline_lib.corpus reads text files: (packed uint8, offsets int64 (n + 1), ends int64 (input "
        "position after each document's last line), consumed, lines, chars, empty, invalid int64 (indices "
        "of the documents that are not UTF-8), invalid_lines int64 (their first line)). Bytes past "
        "`consumed` (an incomplete line or paragraph) come again with the next block; final=True: the "
        "input ends with this block. in_place=True: the documents are packed at the start of `data` "
        "(writable; bytes past `consumed` untouched) and packed is None.");

    m.def("split", &split_py, nb::arg("data"), nb::arg("pattern"), nb::arg("ascii_first") = true,
          "Pre-tokenization pieces of UTF-8 bytes (valid or not) with a pattern id. ascii_first=False: "
          "without the 16-byte scanner of ASCII pieces (the general path alone, for tests).");

    nb::class_<PieceCounter>(m, "PieceCounter", "Counts pre-tokenization pieces over documents.")
        .def(nb::init<int>(), nb::arg("pattern"))
        .def("add", &counter_add, nb::arg("data"), "Split one document and count its pieces (GIL released).")
        .def("add_batch", &counter_add_batch, nb::arg("docs"), "add() for many documents (GIL released).")
        .def("add_counts", &counter_add_counts, nb::arg("pieces"), nb::arg("counts"),
             "Add counts for pieces (the reduce step).")
        .def("__len__", [](PieceCounter& self) {
            std::lock_guard<std::mutex> lock(self.mu);
            return self.core.size();
        })
        .def_prop_ro("total", [](PieceCounter& self) {
            std::lock_guard<std::mutex> lock(self.mu);
            return self.core.total();
        }, "Sum of all counts.")
        .def("to_arrays", &counter_to_arrays,
             "(pieces, counts): pieces sorted by bytes ascending, counts as int64.");

    m.def("learn_merges", &learn_merges_py, nb::arg("pieces"), nb::arg("counts"), nb::arg("n_merges"),
          nb::arg("min_frequency") = 1, nb::arg("progress") = nb::none(), nb::arg("max_token_bytes") = nb::none(),
          nb::arg("with_counts") = false, nb::arg("ties") = "bytes",
          "Byte-level BPE merges (left_id, right_id, merged_id) as an int32 array of shape (m, 3); "
          "equal to bpe_reference.learn_merges(dict(zip(pieces, counts)), ...). with_counts: "
          "(rows, int64 counts of each merged pair when it was merged). ties: 'bytes' (smallest "
          "(left, right) bytes) or 'first-seen' (first occurrence, pieces in the order given).");
    m.def("learn_symbol_merges", &learn_symbol_merges_py, nb::arg("alphabet"), nb::arg("symbols"), nb::arg("offsets"),
          nb::arg("counts"), nb::arg("n_merges"), nb::arg("min_frequency") = 1, nb::arg("progress") = nb::none(),
          nb::arg("max_token_bytes") = nb::none(), nb::arg("ties") = "bytes",
          "BPE merges over pieces of symbols (piece k is symbols[offsets[k]:offsets[k + 1]], ids into "
          "alphabet, a list of each symbol's bytes): (rows int32 (m, 3), counts int64 (m,)); equal to "
          "bpe_reference.learn_symbol_merges.");

    nb::class_<Encoder>(m, "Encoder", "tiktoken-style BPE encoder over a split pattern.")
        .def("__init__", &encoder_init, nb::arg("tokens"), nb::arg("ranks"), nb::arg("pattern"),
             nb::arg("start_chars") = false, nb::arg("unknown") = nb::none(),
             "start_chars: BPE starts from UTF-8 characters; a character that is no token becomes `unknown` "
             "(an id) or, when None, its single-byte tokens.")
        .def("encode_ordinary", &encoder_encode, nb::arg("data"), nb::arg("unless") = nb::none(),
             "Encode a str (its UTF-8) or bytes (no special tokens) to a uint32 array; None, without encoding, "
             "when the text holds the str `unless`.")
        .def("encode_ordinary_batch", &encoder_encode_batch, nb::arg("docs"), nb::arg("num_threads") = 0,
             "Encode documents on threads: (ids uint32, offsets uint64 of len(docs) + 1).")
        .def("encode_ordinary_texts", &encoder_encode_texts, nb::arg("docs"), nb::arg("num_threads") = 0,
             "encode_ordinary_batch() of str (UTF-8) or bytes documents: (ids uint32, offsets uint64).")
        .def_rw("text_threads", &Encoder::text_threads,
                "Threads a text of 512 KiB or more is encoded on (cut at safe points); 1: none.")
        .def(
            "safe_cut",
            [](Encoder& self, nb::bytes data, size_t start) {
                return self.core->safe_cut(bytes_ptr(data), data.size(), start);
            },
            nb::arg("data"), nb::arg("start"),
            "The first offset past `start` at which the text threads may cut `data`, else len(data).")
        .def("encode_ordinary_list", &encoder_encode_list, nb::arg("text"), nb::arg("unless") = nb::none(),
             "encode_ordinary() of a str (UTF-8) or bytes as a list of ints (None when it holds `unless`).")
        .def("encode_ordinary_batch_lists", &encoder_encode_batch_lists, nb::arg("texts"), nb::arg("num_threads") = 0,
             nb::arg("unless") = nb::none(),
             "encode_ordinary_batch() of str (UTF-8) or bytes texts as lists of ints, on threads (None when one "
             "holds `unless`).")
        .def("encode_piece", &encoder_encode_piece, nb::arg("piece"), nb::arg("periodic") = true,
             "BPE of one piece (no splitting); periodic=False: without the shortcut for long repeating pieces.")
        .def("decode", &encoder_decode, nb::arg("ids"), "Bytes of the ids; ValueError on an unknown id.")
        .def_prop_ro("vocab_size", [](Encoder& self) { return self.core->vocab_size(); })
        .def_prop_ro("token_count", [](Encoder& self) { return self.core->token_count(); },
                     "The ordinary tokens (vocab_size counts the gaps between their ids too).")
        .def("has_id", [](Encoder& self, size_t id) { return self.core->has_id(id); }, nb::arg("id"),
             "Whether `id` is an ordinary token's.")
        .def_static("from_ranks_file", &encoder_from_ranks_file, nb::arg("data"), nb::arg("pattern"),
                    "A byte-level Encoder from a tiktoken ranks file's bytes (`base64(token) rank` lines), "
                    "parsed without Python objects; None where parse_ranks() gives None. ValueError on a "
                    "vocabulary the encoder refuses (two tokens with one id, a byte with no token).");

    // Documents as one buffer and int64 offsets (document k is data[offsets[k]:offsets[k + 1]]).
    nb::cpp_function_def<PieceCounter>(&counter_add_buffer, nb::scope(nb::type<PieceCounter>()),
                                       nb::name("add_buffer"), nb::is_method(), nb::arg("data"), nb::arg("offsets"),
                                       "add_batch() for documents given as one buffer and their offsets (GIL released); "
                                       "ValueError on offsets that are not non-decreasing indices into data.");
    nb::cpp_function_def<Encoder>(&encoder_encode_buffer_ids, nb::scope(nb::type<Encoder>()),
                                  nb::name("encode_ordinary_buffer_ids"), nb::is_method(), nb::arg("data"),
                                  nb::arg("bounds"), nb::arg("num_threads") = 0, nb::arg("out") = nb::none(),
                                  "encode_ordinary_buffer()'s ids alone, as a memoryview of uint32 (no NumPy), "
                                  "the documents' bounds given as a list of ints; ValueError on bounds that are "
                                  "not non-decreasing indices into data. Where the writable buffer `out` has room "
                                  "for the ids, they are written at its start and the memoryview is of `out`.");
    nb::cpp_function_def<Encoder>(&encoder_encode_buffer, nb::scope(nb::type<Encoder>()),
                                  nb::name("encode_ordinary_buffer"), nb::is_method(), nb::arg("data"),
                                  nb::arg("offsets"), nb::arg("num_threads") = 0,
                                  "encode_ordinary_batch() for documents given as one buffer and their offsets: "
                                  "(ids uint32, offsets uint64 of len(offsets)); ValueError on offsets that are "
                                  "not non-decreasing indices into data.");
    m.def(
        "utf8_chars",
        [](nb::handle data_obj) {
            ByteView data(data_obj);
            nb::gil_scoped_release release;
            return utf8_chars(data.data(), data.size());
        },
        nb::arg("data"),
        "Code points in a bytes-like object if it is valid UTF-8 (as Python's strict codec sees it), "
        "else -1 (GIL released).");
    m.def(
        "parse_ranks",
        [](nb::handle data_obj) -> nb::object {
            std::string bytes;
            std::vector<RankLine> lines;
            if (!parse_ranks_file(data_obj, bytes, lines)) return nb::none();
            nb::dict ranks;
            for (const RankLine& line : lines) {
                nb::object token = nb::steal(PyBytes_FromStringAndSize(bytes.data() + line.token_off, line.token_len));
                if (!token.is_valid()) throw nb::python_error();
                ranks[token] = nb::int_(line.rank);
            }
            if (ranks.size() != lines.size()) return nb::none();  // a token twice
            return std::move(ranks);
        },
        nb::arg("data"),
        "The {token: rank} of a tiktoken ranks file's `base64(token) rank` lines, or None if a line is "
        "not one (strict base64, a rank below MAX_VOCAB_SIZE, a token of at most MAX_TOKEN_BYTES) or a "
        "token comes twice: the caller then parses it line by line to name the line.");
    m.def("sha256_documents", &sha256_documents, nb::arg("data"), nb::arg("offsets"), nb::arg("portable") = false,
          "SHA-256 digest of each document data[offsets[k]:offsets[k + 1]], concatenated (32 bytes each; GIL "
          "released). portable: without the CPU's SHA instructions even where it has them (for tests).");
}
