#include <nanobind/nanobind.h>
namespace nb = nanobind;
NB_MODULE(_tokcore, m) {
    m.attr("CORE_VERSION") = "0";
}
