// The reverse-mode engine: recording ops, ordering the graph without recursion, running the
// backward functions, accumulating gradients and freeing the graph.

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/elementwise.h"
#include "autograd/hooks.h"
#include "autograd/tensor.h"

namespace attograd {

namespace {
thread_local bool g_grad_enabled = true;
thread_local bool g_backward_frees_saved = false;
thread_local bool g_in_backward = false;  // backward functions read saved values through writable pointers

// Releases a chain of nodes with a loop instead of nested shared_ptr destructors, so that a
// graph of any depth is freed without overflowing the stack (as PyTorch's deleteNode does).
// It runs in destructors, also while an exception (out of memory) unwinds, so it never throws: when the list cannot
// grow, the node is freed where it is (nesting, as shared_ptr would).
void release_node(std::shared_ptr<Node> node) noexcept {
  thread_local std::vector<std::shared_ptr<Node>> pending;
  thread_local bool draining = false;
  auto push = [](std::shared_ptr<Node>& n) noexcept {
    try {
      pending.push_back(std::move(n));  // strong guarantee: n is untouched when this throws
    } catch (...) {
    }
  };
  push(node);
  if (node) return;  // not queued: freed here, nested
  if (draining) return;
  draining = true;
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n.use_count() == 1) {
      for (auto& in : n->inputs) {
        if (in && in.ptr().use_count() == 1 && in->grad_fn) push(in->grad_fn);
      }
    }
    // n is destroyed here; the inputs it frees no longer own a grad_fn, so nothing nests.
  }
  draining = false;
}
}  // namespace

TensorImpl::~TensorImpl() {
  if (grad_fn) release_node(std::move(grad_fn));
}

InputRef::InputRef(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {
  if (impl_ && impl_->grad_fn) {
    impl_->graph_refs.fetch_add(1, std::memory_order_relaxed);
    counted_ = true;
  }
}

InputRef& InputRef::operator=(InputRef&& other) noexcept {
  if (this != &other) {
    reset();
    impl_ = std::move(other.impl_);
    counted_ = other.counted_;
    other.counted_ = false;
  }
  return *this;
}

void InputRef::reset() noexcept {
  if (counted_) impl_->graph_refs.fetch_sub(1, std::memory_order_relaxed);
  counted_ = false;
  impl_.reset();
}

// Called when a handle of a tensor that recorded ops hold as an input goes away: if every other owner of the
// impl is such an op (use_count = graph_refs + this handle), no handle can ever read the data again, and the
// backward does not need it (ops save their own detached views of what they use), so the storage is released
// now instead of when the graph is freed. Only outputs of recorded ops (non-leaves) are counted.
// The recompute recipe goes too: no new op can take the tensor as an input any more, and the ops that did keep their
// own copy (SavedTensor), so the impl's copy would only keep the recipe's inputs alive past their own op's backward.
void Tensor::release_data_if_unreachable() noexcept {
  TensorImpl* t = impl_.get();
  if (t->grad_fn && t->storage && impl_.use_count() == t->graph_refs.load(std::memory_order_relaxed) + 1) {
    t->storage.reset();
    t->recompute.reset();
  }
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  const TensorImpl& impl = *t.impl();
  if (impl.recompute && impl.storage && !impl.storage->modified)
    recompute_ = impl.recompute;
  else
    value_ = t.detach();
}

Tensor SavedTensor::get() const {
  if (recompute_) return (*recompute_)();
  return value_;
}

void SavedTensor::reset() {
  value_ = Tensor();
  recompute_.reset();
}

bool backward_frees_saved() { return g_backward_frees_saved; }

bool detail::writes_bump_version() { return !g_grad_enabled && !g_in_backward; }

bool is_grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

template <class Range>
static Tensor record_impl(const char* name, Tensor out, const Range& inputs, BackwardFn backward) {
  if (!g_grad_enabled) return out;
  bool any = false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) any = true;
  if (!any) return out;
  auto node = std::make_shared<Node>();
  node->name = name;
  node->inputs.reserve(inputs.size());
  size_t i = 0;
  for (const Tensor& t : inputs) {
    node->inputs.emplace_back(t.defined() && t.requires_grad() ? t.impl() : nullptr);
    // A leaf's data may be changed in place (under NoGradGuard) before the backward: note its version.
    if (t.defined() && !t.impl()->grad_fn && t.impl()->storage)
      node->leaf_versions.push_back({t.impl()->storage, t.impl(), t.impl()->storage->version, i});
    ++i;
  }
  node->backward = std::move(backward);
  // `out` must be a fresh result; give it history.
  TensorImpl* impl = out.impl().get();
  impl->grad_fn = std::move(node);
  impl->requires_grad = true;
  return out;
}

Tensor record(const char* name, Tensor out, std::initializer_list<Tensor> inputs, BackwardFn backward) {
  return record_impl(name, std::move(out), inputs, std::move(backward));
}

Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs, BackwardFn backward) {
  return record_impl(name, std::move(out), inputs, std::move(backward));
}

namespace {

// True when t is the only handle to its impl and its impl the only owner of a storage of exactly its size: nothing
// else can see its values, so they may be adopted or updated in place.
bool uniquely_owned(const Tensor& t) {
  const std::shared_ptr<TensorImpl>& p = t.impl();
  return p.use_count() == 1 && !p->grad_fn && p->storage && p->storage.use_count() == 1 && p->offset == 0 &&
         p->storage->nbytes == t.nbytes();
}

// Adds g into the leaf's .grad: the first time g itself when nothing else can see it, else a private copy; then in
// place (no allocation).
void accumulate_into_grad(TensorImpl* impl, const Tensor& g) {
  if (!impl->grad) {
    if (uniquely_owned(g)) {
      impl->grad = g.impl();
      return;
    }
    Tensor copy = empty(g.shape(), {.dtype = g.dtype()});
    std::memcpy(copy.raw_data(), g.const_raw_data(), g.nbytes());
    impl->grad = copy.impl();
    return;
  }
  Tensor acc(impl->grad);
  add_(acc, g);
}

// Post-accumulate-grad hooks (autograd/hooks.h): leaf -> (id, hook), in registration order. The engine looks only
// when some hook exists (one relaxed load per leaf otherwise).
struct HookRegistry {
  std::mutex mutex;
  std::unordered_map<const TensorImpl*, std::vector<std::pair<uint64_t, std::function<void(const Tensor&)>>>> hooks;
  std::atomic<int64_t> count{0};
  uint64_t next_id = 1;
};

HookRegistry& hook_registry() {
  static HookRegistry* r = new HookRegistry;  // never destroyed: handles may outlive static destruction
  return *r;
}

void run_post_accumulate_grad_hooks(const std::shared_ptr<TensorImpl>& leaf) {
  HookRegistry& r = hook_registry();
  if (r.count.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::function<void(const Tensor&)>> fns;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.hooks.find(leaf.get());
    if (it == r.hooks.end()) return;
    for (const auto& [id, fn] : it->second) fns.push_back(fn);
  }
  const Tensor t(leaf);
  for (const auto& fn : fns) fn(t);  // outside the lock: a hook may register or remove hooks
}

// Reverse topological order of the tensors reachable from root, by an explicit stack.
std::vector<std::shared_ptr<TensorImpl>> topo_order(const std::shared_ptr<TensorImpl>& root) {
  std::vector<std::shared_ptr<TensorImpl>> post;
  std::unordered_set<TensorImpl*> seen;
  struct Frame {
    std::shared_ptr<TensorImpl> t;
    size_t next;
  };
  std::vector<Frame> stack;
  stack.push_back({root, 0});
  seen.insert(root.get());
  while (!stack.empty()) {
    Frame& f = stack.back();
    Node* n = f.t->grad_fn.get();
    if (n && f.next < n->inputs.size()) {
      const auto& in = n->inputs[f.next++];
      if (in && seen.insert(in.get()).second) stack.push_back({in.ptr(), 0});
      continue;
    }
    post.push_back(std::move(f.t));
    stack.pop_back();
  }
  return {post.rbegin(), post.rend()};
}

}  // namespace

Tensor reuse_or_empty_like(const Tensor& g) { return uniquely_owned(g) ? g : empty(g.shape(), {.dtype = g.dtype()}); }

Tensor reuse_temporary_or_empty(Tensor&& x) {
  const std::shared_ptr<TensorImpl>& p = x.impl();
  // Not a leaf while recording: a recorded op may have noted its version (Node::leaf_versions) without keeping it.
  if (p.use_count() == 1 && !p->retains_grad && p->storage && p->storage.use_count() == 1 && p->offset == 0 &&
      p->storage->nbytes == x.nbytes() && !(p->grad_fn == nullptr && is_grad_enabled()))
    return x.detach();  // a fresh impl on the same storage (x itself may still be recorded as an input)
  return empty(x.shape(), {.dtype = x.dtype()});
}

namespace {

// Throws when the data of a leaf input of `node` was written since the op was recorded (PyTorch's "one of the
// variables needed for gradient computation has been modified by an inplace operation").
void check_version(const Node& node, const SavedVersion& v) {
  const std::shared_ptr<Storage> storage = v.storage.lock();
  if (!storage || storage->version == v.version) return;
  const std::shared_ptr<TensorImpl> t = v.tensor.lock();
  throw Error(node.name, str_cat("input ", v.input, " of '", node.name, "' (a leaf tensor",
                             t ? str_cat(" of shape ", t->shape, t->requires_grad ? " that requires grad" : "") : "",
                             ") was modified in place after the forward pass (its data is at version ",
                             storage->version, ", the op saw version ", v.version,
                             "): the gradients would use the new values. Change it after backward() (as optimizers "
                             "do), or on a clone()"));
}

}  // namespace

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  check_defined("backward");
  ATTO_CHECK(impl_->requires_grad, "backward",
             "tensor of shape ", shape(), " does not require grad and has no grad_fn");
  Tensor seed;
  if (!gradient.defined()) {
    ATTO_CHECK(numel() == 1, "backward", "grad can be implicitly created only for one-element outputs, got shape ",
               shape(), "; pass a gradient of that shape");
    seed = ones(shape(), {.dtype = dtype()});
  } else {
    ATTO_CHECK(gradient.shape() == shape(), "backward", "gradient of shape ", gradient.shape(),
               " does not match output of shape ", shape());
    ATTO_CHECK(gradient.dtype() == dtype(), "backward", "gradient dtype ", dtype_name(gradient.dtype()),
               " does not match output dtype ", dtype_name(dtype()));
    seed = gradient.detach();
  }

  NoGradGuard no_grad;
  struct InBackward {  // restored on exceptions too; nested passes (a backward inside a backward) keep it set
    bool prev = g_in_backward;
    InBackward() { g_in_backward = true; }
    ~InBackward() { g_in_backward = prev; }
  } in_backward;
  std::vector<std::shared_ptr<TensorImpl>> order = topo_order(impl_);
  std::unordered_map<TensorImpl*, Tensor> grads;
  grads.reserve(order.size());
  grads[impl_.get()] = seed;

  for (const auto& t : order) {
    // Every op that uses t has run its backward (reverse topological order) and keeps its own copy of t's recipe:
    // the impl's copy (which `order` would keep until the end of the pass) goes now.
    t->recompute.reset();
    auto it = grads.find(t.get());
    if (it == grads.end()) continue;
    Tensor g = std::move(it->second);
    grads.erase(it);
    Node* node = t->grad_fn.get();
    if (!node || t->retains_grad) accumulate_into_grad(t.get(), g);
    if (!node) run_post_accumulate_grad_hooks(t);
    if (!node) continue;
    ATTO_CHECK(node->backward != nullptr, "backward",
               "trying to backward through the graph a second time (op '", node->name,
               "'); its saved values were freed: call backward(grad, /*retain_graph=*/true) the first time");
    for (const SavedVersion& v : node->leaf_versions) check_version(*node, v);
    GradInputs gi([&] {
      std::vector<bool> need(node->inputs.size());
      for (size_t i = 0; i < need.size(); ++i) need[i] = static_cast<bool>(node->inputs[i]);
      return need;
    }());
    {
      struct FreesSaved {  // set for this call only (restored on exceptions too)
        bool prev = g_backward_frees_saved;
        explicit FreesSaved(bool on) { g_backward_frees_saved = on; }
        ~FreesSaved() { g_backward_frees_saved = prev; }
      } frees_saved(!retain_graph);
      node->backward(g, gi);
    }
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      TensorImpl* in = node->inputs[i].get();
      if (!in) continue;
      Tensor& gin = gi[i];
      if (!gin.defined()) continue;  // the op says this input gets no gradient (e.g. a zero-size case)
      if (gin.shape() != in->shape || gin.dtype() != in->dtype)
        throw Error("backward", str_cat("internal error: op '", node->name, "' returned a gradient of shape ",
                                    gin.shape(), " (", dtype_name(gin.dtype()), ") for input ", i, " of shape ",
                                    in->shape, " (", dtype_name(in->dtype), ")"));
      auto [slot, fresh] = grads.try_emplace(in, std::move(gin));
      if (fresh) continue;
      if (uniquely_owned(slot->second))
        add_(slot->second, gin);  // accumulate in place: no new buffer
      else
        slot->second = add(slot->second, gin);
    }
    if (!retain_graph) {  // this op's saved values are no longer needed: free them now, not after the whole pass
      node->backward = nullptr;
      node->inputs.clear();
    }
  }

  if (!retain_graph) {
    for (const auto& t : order) {
      if (t->grad_fn) {
        t->grad_fn->backward = nullptr;  // frees the saved values
        t->grad_fn->inputs.clear();       // frees the forward activations the graph kept alive
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Post-accumulate-grad hooks

GradHookHandle& GradHookHandle::operator=(GradHookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

void GradHookHandle::remove() noexcept {
  if (id_ == 0) return;
  HookRegistry& r = hook_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.hooks.begin(); it != r.hooks.end(); ++it) {
    auto& v = it->second;
    for (auto h = v.begin(); h != v.end(); ++h) {
      if (h->first != id_) continue;
      v.erase(h);
      if (v.empty()) r.hooks.erase(it);
      r.count.fetch_sub(1, std::memory_order_relaxed);
      id_ = 0;
      return;
    }
  }
  id_ = 0;
}

GradHookHandle register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor&)> fn) {
  const char* me = "register_post_accumulate_grad_hook";
  ATTO_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(), me,
             "the tensor must be a leaf that requires grad (a parameter), got ",
             !leaf.defined()            ? std::string("an undefined tensor")
             : !leaf.requires_grad()    ? std::string("one without requires_grad")
                                        : "the output of op '" + leaf.grad_fn_name() + "'");
  ATTO_CHECK(fn != nullptr, me, "no hook given");
  HookRegistry& r = hook_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  GradHookHandle h;
  h.id_ = r.next_id++;
  r.hooks[leaf.impl().get()].emplace_back(h.id_, std::move(fn));
  r.count.fetch_add(1, std::memory_order_relaxed);
  return h;
}

}  // namespace attograd
