// freeride._C's tasks (task_bindings.hpp).
#include "task_bindings.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "builtin_tasks.hpp"
#include "check.hpp"
#include "graph_layout.hpp"
#include "raw_kernel_task.hpp"
#include "task.hpp"
#include "unbuilt_task.hpp"

namespace py = pybind11;
using freeride::Task;

namespace freeride_ext {

void bind_tasks(py::module_& m) {
  py::class_<Task, std::shared_ptr<Task>>(m, "Task")
      .def_property_readonly("name", &Task::name)
      .def_property_readonly("num_phases", &Task::num_phases)
      .def("num_items", &Task::num_items, py::arg("phase"))
      .def_property_readonly("total_items", &Task::total_items)
      .def_property("memory_bytes", &Task::memory_bytes, &Task::set_memory_bytes);

  m.def("spin_task", &freeride::make_spin_task, py::arg("items"), py::arg("phases"),
        py::arg("ns_per_item"), py::arg("slice_blocks") = 0);
  m.def("saxpy_task", &freeride::make_saxpy_task, py::arg("a"), py::arg("x"), py::arg("y"),
        py::arg("n"), py::arg("chunk"), py::arg("dtype"));
  m.def("item_counter_task", &freeride::make_item_counter_task, py::arg("items"),
        py::arg("phases"), py::arg("counts"), py::arg("phase_done"), py::arg("violations"),
        py::arg("times"), py::arg("ns_per_item"), py::arg("fail_phase"), py::arg("fail_item"));

  m.def("unbuilt_task", &freeride::make_unbuilt_task, py::arg("name"), py::arg("memory_bytes"),
        py::arg("phases"), py::arg("items"),
        "A placeholder for a task refused before its buffers were made (unbuilt_task.hpp): "
        "`phases` of `items` items, as the task it stands for; the executor fails it at "
        "submit for needing more than the whole memory budget, and its items fail it.");

  using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
  m.def(
      "csr_transpose",
      [](const Int64Array& indptr, const Int64Array& indices) {
        FR_ARG(indptr.ndim() == 1 && indices.ndim() == 1, "indptr and indices must be 1-D");
        FR_ARG(indptr.size() >= 2, "indptr must have at least 2 entries (1 node)");
        const int64_t n = static_cast<int64_t>(indptr.size()) - 1;
        const int64_t edges = static_cast<int64_t>(indices.size());
        Int64Array in_indptr(n + 1);
        Int64Array in_indices(edges);
        const int64_t* ptr = indptr.data();
        const int64_t* idx = indices.data();
        int64_t* in_ptr = in_indptr.mutable_data();
        int64_t* in_idx = in_indices.mutable_data();
        {
          py::gil_scoped_release release;
          freeride::csr_transpose(ptr, idx, n, edges, in_ptr, in_idx);
        }
        return py::make_tuple(in_indptr, in_indices);
      },
      py::arg("indptr"), py::arg("indices"),
      "(in_indptr, in_indices): the CSC (in-links) of the graph whose out-links are the CSR "
      "(indptr, indices); sources grouped by destination in out-link order.");

  m.def(
      "pagerank_task",
      [](uint64_t n, uintptr_t in_indptr, uintptr_t in_indices, uintptr_t inv_outdeg,
         uintptr_t rank_a, uintptr_t rank_b, uintptr_t contrib, uintptr_t dangling, uint64_t iters,
         double damping, uint64_t nodes_per_item) {
        freeride::PageRankBuffers b;
        b.n = n;
        b.in_indptr = in_indptr;
        b.in_indices = in_indices;
        b.inv_outdeg = inv_outdeg;
        b.rank_a = rank_a;
        b.rank_b = rank_b;
        b.contrib = contrib;
        b.dangling = dangling;
        return freeride::make_pagerank_task(b, iters, damping, nodes_per_item);
      },
      py::arg("n"), py::arg("in_indptr"), py::arg("in_indices"), py::arg("inv_outdeg"),
      py::arg("rank_a"), py::arg("rank_b"), py::arg("contrib"), py::arg("dangling"),
      py::arg("iters"), py::arg("damping"), py::arg("nodes_per_item"));

  m.def(
      "gaussian_blur_task",
      [](uint64_t planes, uint64_t h, uint64_t w, int dtype, uintptr_t in, uintptr_t tmp,
         uintptr_t out, uintptr_t weights, int radius, uint64_t rows) {
        freeride::ImageShape s{planes, h, w, h, w, dtype};
        return freeride::make_gaussian_blur_task(s, in, tmp, out, weights, radius, rows);
      },
      py::arg("planes"), py::arg("h"), py::arg("w"), py::arg("dtype"), py::arg("in_"),
      py::arg("tmp"), py::arg("out"), py::arg("weights"), py::arg("radius"), py::arg("rows"));
  m.def(
      "resize_task",
      [](uint64_t planes, uint64_t in_h, uint64_t in_w, uint64_t out_h, uint64_t out_w, int dtype,
         uintptr_t in, uintptr_t out, uint64_t rows) {
        freeride::ImageShape s{planes, in_h, in_w, out_h, out_w, dtype};
        return freeride::make_resize_task(s, in, out, rows);
      },
      py::arg("planes"), py::arg("in_h"), py::arg("in_w"), py::arg("out_h"), py::arg("out_w"),
      py::arg("dtype"), py::arg("in_"), py::arg("out"), py::arg("rows"));

  m.def(
      "raw_kernel_task",
      [](std::string name,
         const std::vector<std::tuple<uintptr_t, uint64_t, uint32_t, uint32_t, uint32_t>>& kernels,
         uint64_t phases, std::vector<uint64_t> args, bool device_phases) {
        std::vector<freeride::RawPhase> ks;
        ks.reserve(kernels.size());
        for (const auto& [function, items, block, shared_mem, grid] : kernels) {
          ks.push_back(freeride::RawPhase{function, items, block, shared_mem, grid});
        }
        return freeride::make_raw_kernel_task(std::move(name), std::move(ks), phases,
                                              std::move(args), device_phases);
      },
      py::arg("name"), py::arg("kernels"), py::arg("phases"), py::arg("args"),
      py::arg("device_phases") = false,
      "kernels: (CUfunction, items, block, shared_mem, grid) each; phase p runs kernel "
      "p % len(kernels); args: one word per parameter; device_phases: the one kernel uses "
      "freeride::for_each_phase_item, so one launch may serve every phase");
  m.def(
      "function_info",
      [](uintptr_t function) {
        const freeride::FunctionInfo info = freeride::query_function(function);
        py::dict out;
        out["max_threads_per_block"] = info.max_threads_per_block;
        out["static_shared_bytes"] = info.static_shared_bytes;
        out["max_dynamic_shared_bytes"] = info.max_dynamic_shared_bytes;
        out["num_regs"] = info.num_regs;
        out["param_sizes"] =
            info.has_param_sizes ? py::object(py::cast(info.param_sizes)) : py::object(py::none());
        return out;
      },
      py::arg("function"), "What the driver says about a loaded CUfunction.");
  m.def("set_max_dynamic_shared", &freeride::set_max_dynamic_shared, py::arg("function"),
        py::arg("bytes"));
}

}  // namespace freeride_ext
