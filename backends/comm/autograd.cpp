#include "hp/comm/autograd.h"

#include <torch/autograd.h>

#include "hp/comm/group.h"

namespace hp::dist {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through saved_data as an integer: IValue has no slot for
// a plain pointer, and the group outlives the graph by contract.
std::int64_t pack(Group& g) { return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&g)); }
Group& unpack(AutogradContext* ctx) {
  return *reinterpret_cast<Group*>(static_cast<std::intptr_t>(ctx->saved_data["group"].toInt()));
}

at::Tensor own_chunk(const at::Tensor& x, Group& g, std::int64_t dim) {
  if (dim < 0) dim += x.dim();
  TORCH_CHECK(x.size(dim) % g.size() == 0, "scatter along dim ", dim, ": size ", x.size(dim),
              " is not divisible by the size ", g.size(), " of group '", g.name(), "'");
  return x.chunk(g.size(), dim)[g.rank()].contiguous();
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t g) {
    ctx->saved_data["group"] = g;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor gr = grads[0].contiguous().clone();
    unpack(ctx).all_reduce(gr);
    return {gr, at::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, std::int64_t g) {
    at::Tensor y = x.contiguous().clone();
    reinterpret_cast<Group*>(static_cast<std::intptr_t>(g))->all_reduce(y);
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct ScatterToGroup : torch::autograd::Function<ScatterToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t g,
                            std::int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return own_chunk(x, *reinterpret_cast<Group*>(static_cast<std::intptr_t>(g)), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto dim = ctx->saved_data["dim"].toInt();
    return {unpack(ctx).all_gather(grads[0].contiguous(), dim), at::Tensor(), at::Tensor()};
  }
};

struct GatherFromGroup : torch::autograd::Function<GatherFromGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t g,
                            std::int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return reinterpret_cast<Group*>(static_cast<std::intptr_t>(g))->all_gather(x.contiguous(), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto dim = ctx->saved_data["dim"].toInt();
    return {own_chunk(grads[0], unpack(ctx), dim), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterToGroup : torch::autograd::Function<ReduceScatterToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t g,
                            std::int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return reinterpret_cast<Group*>(static_cast<std::intptr_t>(g))->reduce_scatter(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto dim = ctx->saved_data["dim"].toInt();
    return {unpack(ctx).all_gather(grads[0].contiguous(), dim), at::Tensor(), at::Tensor()};
  }
};

struct AllGatherFromGroup : torch::autograd::Function<AllGatherFromGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t g,
                            std::int64_t dim) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["dim"] = dim;
    return reinterpret_cast<Group*>(static_cast<std::intptr_t>(g))->all_gather(x.contiguous(), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto dim = ctx->saved_data["dim"].toInt();
    return {unpack(ctx).reduce_scatter(grads[0].contiguous(), dim), at::Tensor(), at::Tensor()};
  }
};

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t g,
                            std::vector<std::int64_t> send, std::vector<std::int64_t> recv) {
    ctx->saved_data["group"] = g;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return reinterpret_cast<Group*>(static_cast<std::intptr_t>(g))->all_to_all(x, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto send = ctx->saved_data["send"].toIntVector();
    auto recv = ctx->saved_data["recv"].toIntVector();
    return {unpack(ctx).all_to_all(grads[0].contiguous(), recv, send), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_group(const at::Tensor& x, Group& g) {
  return g.size() == 1 ? x : CopyToGroup::apply(x, pack(g));
}
at::Tensor reduce_from_group(const at::Tensor& x, Group& g) {
  return g.size() == 1 ? x : ReduceFromGroup::apply(x, pack(g));
}
at::Tensor scatter_to_group(const at::Tensor& x, Group& g, std::int64_t dim) {
  return g.size() == 1 ? x : ScatterToGroup::apply(x, pack(g), dim);
}
at::Tensor gather_from_group(const at::Tensor& x, Group& g, std::int64_t dim) {
  return g.size() == 1 ? x : GatherFromGroup::apply(x, pack(g), dim);
}
at::Tensor reduce_scatter_to_group(const at::Tensor& x, Group& g, std::int64_t dim) {
  return g.size() == 1 ? x : ReduceScatterToGroup::apply(x, pack(g), dim);
}
at::Tensor all_gather_from_group(const at::Tensor& x, Group& g, std::int64_t dim) {
  return g.size() == 1 ? x : AllGatherFromGroup::apply(x, pack(g), dim);
}
at::Tensor all_to_all(const at::Tensor& x, Group& g, const std::vector<std::int64_t>& send_counts,
                      const std::vector<std::int64_t>& recv_counts) {
  return AllToAll::apply(x, pack(g), send_counts, recv_counts);
}

}  // namespace hp::dist
