// Statements: output, if, for (with loop.*, else, inline filter), set,
// set blocks, macros, break/continue.
#include <algorithm>

#include "text/jinja_builtins.h"
#include "text/jinja_runtime.h"
#include "text/jinja_strings.h"

namespace ferry::text::jinja {

Runtime::Runtime(const Program& program, const RenderOptions& options, const Value& context)
    : program_(program), options_(options), context_(context) {}

Runtime::~Runtime() {
  // Macros hold their defining frame and namespaces may hold anything, so
  // both can sit in reference cycles; emptying them frees everything.
  for (auto& f : captured_frames_) {
    auto doomed = std::move(f->vars);
    f->vars.clear();
  }
  for (auto& ns : namespaces_) ns->clear();
}

std::string Runtime::render() {
  auto root = std::make_shared<Frame>();
  try {
    exec(program_.body, root);
  } catch (EvalError& e) {
    LineCol lc = line_col(program_.source, e.offset);
    throw Error("[" + program_.op + "] " + std::to_string(lc.line) + ":" + std::to_string(lc.col) +
                ": " + e.what());
  }
  return std::move(out_);
}

std::tm Runtime::now() const {
  return options_.clock ? options_.clock() : local_now();
}

void Runtime::check_string_size(std::size_t bytes) const {
  if (bytes > options_.max_output_bytes) {
    throw EvalError("string of " + std::to_string(bytes) + " bytes exceeds the output limit of " +
                    std::to_string(options_.max_output_bytes));
  }
}

void Runtime::check_list_size(std::size_t items) const {
  if (items > options_.max_list_items) {
    throw EvalError("list of " + std::to_string(items) + " items exceeds the limit of " +
                    std::to_string(options_.max_list_items));
  }
}

void Runtime::step() {
  if (++steps_ > options_.max_steps) {
    throw EvalError("template exceeded the limit of " + std::to_string(options_.max_steps) +
                    " evaluation steps");
  }
}

Value Runtime::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) throw EvalError(fn.undefined_hint());
  if (!fn.is_callable()) throw EvalError("'" + type_name(fn) + "' object is not callable");
  step();
  return fn.callable().fn(*this, args);
}

void Runtime::emit(std::string_view s) {
  check_string_size(out_.size() + s.size());
  out_.append(s);
}

std::string Runtime::capture(const Body& body, const std::shared_ptr<Frame>& frame) {
  std::string saved;
  std::swap(saved, out_);
  exec(body, frame);
  std::swap(saved, out_);
  return saved;
}

Runtime::Flow Runtime::exec(const Body& body, const std::shared_ptr<Frame>& frame) {
  for (const NodePtr& n : body) {
    Flow f = exec_node(*n, frame);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Runtime::Flow Runtime::exec_node(const Node& n, const std::shared_ptr<Frame>& frame) {
  try {
    Flow flow = Flow::kNormal;
    switch (n.kind) {
      case Node::Kind::kText:
        emit(n.text);
        break;
      case Node::Kind::kOutput: {
        Value v = eval(*n.expr, frame);
        if (v.is_dict() && !v.is_mapping()) {
          throw EvalError("printing a " + type_name(v) + " object is not supported");
        }
        emit(to_str(v));
        break;
      }
      case Node::Kind::kIf:
        exec_if(n, frame, flow);
        break;
      case Node::Kind::kFor:
        return exec_for(n, frame);
      case Node::Kind::kSet:
        assign(n.target, eval(*n.expr, frame), *frame);
        break;
      case Node::Kind::kSetBlock:
        assign(n.target, Value(capture(n.bodies[0], frame)), *frame);
        break;
      case Node::Kind::kMacro:
        frame->vars[n.text] = define_macro(n, frame);
        break;
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kScope:
        return exec(n.bodies[0], frame);
    }
    return flow;
  } catch (EvalError& e) {
    if (!e.has_offset) {
      e.offset = n.offset;
      e.has_offset = true;
    }
    throw;
  }
}

void Runtime::exec_if(const Node& n, const std::shared_ptr<Frame>& frame, Flow& flow) {
  for (std::size_t i = 0; i < n.conditions.size(); ++i) {
    if (truthy(eval(*n.conditions[i], frame))) {
      flow = exec(n.bodies[i], frame);
      return;
    }
  }
  flow = exec(n.else_body, frame);
}

Runtime::Flow Runtime::exec_for(const Node& n, const std::shared_ptr<Frame>& frame) {
  std::vector<Value> all = iterate(eval(*n.expr, frame));
  auto items = std::make_shared<std::vector<Value>>();
  if (n.filter) {
    // The inline `if` sees the loop target but not `loop`.
    for (Value& v : all) {
      auto probe = std::make_shared<Frame>();
      probe->parent = frame;
      assign(n.target, v, *probe);
      if (truthy(eval(*n.filter, probe))) items->push_back(std::move(v));
    }
  } else {
    *items = std::move(all);
  }
  if (items->empty()) {
    auto else_frame = std::make_shared<Frame>();
    else_frame->parent = frame;
    exec(n.else_body, else_frame);
    return Flow::kNormal;
  }
  auto last_changed = std::make_shared<std::vector<Value>>();
  auto has_changed = std::make_shared<bool>(false);
  const auto len = static_cast<std::int64_t>(items->size());
  for (std::int64_t i = 0; i < len; ++i) {
    step();
    auto iter = std::make_shared<Frame>();
    iter->parent = frame;
    assign(n.target, (*items)[static_cast<std::size_t>(i)], *iter);
    auto loop = std::make_shared<DictData>(DictData::Type::kLoop);
    loop->set("index", Value(i + 1));
    loop->set("index0", Value(i));
    loop->set("revindex", Value(len - i));
    loop->set("revindex0", Value(len - i - 1));
    loop->set("first", Value(i == 0));
    loop->set("last", Value(i == len - 1));
    loop->set("length", Value(len));
    loop->set("depth", Value(1));
    loop->set("depth0", Value(0));
    loop->set("previtem", i > 0 ? (*items)[static_cast<std::size_t>(i - 1)]
                                : Value::undefined("there is no previous item"));
    loop->set("nextitem", i + 1 < len ? (*items)[static_cast<std::size_t>(i + 1)]
                                      : Value::undefined("there is no next item"));
    loop->set("cycle", Value::callable("loop.cycle", [i](Runtime&, CallArgs& a) {
                if (a.args.empty()) throw EvalError("no items for cycling given");
                return a.args[static_cast<std::size_t>(i) % a.args.size()];
              }));
    loop->set("changed",
              Value::callable("loop.changed", [last_changed, has_changed](Runtime&, CallArgs& a) {
                if (*has_changed && last_changed->size() == a.args.size() &&
                    std::equal(a.args.begin(), a.args.end(), last_changed->begin(), equals)) {
                  return Value(false);
                }
                *last_changed = a.args;
                *has_changed = true;
                return Value(true);
              }));
    iter->vars["loop"] = Value::dict(std::move(loop));
    if (exec(n.bodies[0], iter) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Runtime::assign(const Target& t, Value v, Frame& frame) {
  if (!t.attr.empty()) {
    Value ns = lookup(t.names[0], frame);
    if (!ns.is_namespace()) throw EvalError("cannot assign attribute on non-namespace object");
    if (t.attr[0] == '_') {
      throw EvalError("cannot store the underscore-prefixed attribute '" + t.attr +
                      "' on a namespace");
    }
    ns.mutable_namespace().set(t.attr, std::move(v));
    return;
  }
  if (!t.tuple) {
    frame.vars[t.names[0]] = std::move(v);
    return;
  }
  std::vector<Value> parts = iterate(v);
  if (parts.size() != t.names.size()) {
    throw EvalError(
        parts.size() > t.names.size()
            ? "too many values to unpack (expected " + std::to_string(t.names.size()) + ")"
            : "not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
                  std::to_string(parts.size()) + ")");
  }
  for (std::size_t i = 0; i < parts.size(); ++i) frame.vars[t.names[i]] = std::move(parts[i]);
}

Value Runtime::define_macro(const Node& n, const std::shared_ptr<Frame>& frame) {
  captured_frames_.push_back(frame);
  const Node* node = &n;
  std::shared_ptr<Frame> defining = frame;
  return Value::callable(n.text, [this, node, defining](Runtime&, CallArgs& args) -> Value {
    const std::string& name = node->text;
    if (args.args.size() > node->params.size()) {
      throw EvalError("macro '" + name + "' takes not more than " +
                      std::to_string(node->params.size()) + " argument(s)");
    }
    struct DepthGuard {
      int& depth;
      ~DepthGuard() { --depth; }
    } guard{++call_depth_};
    if (call_depth_ > options_.max_call_depth) {
      throw EvalError("macro calls nested deeper than " + std::to_string(options_.max_call_depth));
    }
    auto f = std::make_shared<Frame>();
    f->parent = defining;
    std::vector<bool> bound(node->params.size(), false);
    for (std::size_t i = 0; i < args.args.size(); ++i) {
      f->vars[node->params[i].name] = args.args[i];
      bound[i] = true;
    }
    for (auto& [key, value] : args.kwargs) {
      auto it = std::find_if(node->params.begin(), node->params.end(),
                             [&](const MacroParam& p) { return p.name == key; });
      if (it == node->params.end()) {
        throw EvalError("macro '" + name + "' takes no keyword argument '" + key + "'");
      }
      auto idx = static_cast<std::size_t>(it - node->params.begin());
      if (bound[idx])
        throw EvalError("macro '" + name + "' got multiple values for argument '" + key + "'");
      f->vars[key] = value;
      bound[idx] = true;
    }
    for (std::size_t i = 0; i < node->params.size(); ++i) {
      if (bound[i]) continue;
      const MacroParam& p = node->params[i];
      f->vars[p.name] = p.default_value
                            ? eval(*p.default_value, f)
                            : Value::undefined("parameter '" + p.name + "' was not provided");
    }
    return Value(capture(node->bodies[0], f));
  });
}

}  // namespace ferry::text::jinja
