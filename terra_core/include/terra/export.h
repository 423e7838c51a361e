// Export: the TraceGraph, its case assignment and the generated graph as JSON (for widgets and
// debugging) and as Graphviz DOT (blocks drawn as clusters, in switch-case order).
//
// JSON shapes (all ids are the engine's dense ids; 64-bit hashes and tensor identities are hex
// strings, because JavaScript numbers cannot hold them):
//   TraceGraph: {traces, paths, ends:{normal,exception,break}, nodes:[{id,key,label,op,source,
//     where,count,fetch_count,outputs:[{count,tensors:[{sizes,strides,dtype,device_type,
//     device_index,requires_grad}]}],inputs:[[{kind,node|id,output,count}]]}],
//     control_edges:[{id,from,to,count}], data_edges:[{from,output,to,input,count}]} plus, with
//     cases, blocks:[{id,nodes}], switch_cases:[{block,entering}], back_edges (edges by id: an
//     edge's id is its place in control_edges).
//   Source: {op, frames:[{file,line,function}] outermost first} or null; where: the user's frame
//     (user_frame) as {file,line,function} or null. The runtime's views (runtime/graph.h) are
//     this same schema with what only the runtime knows added to it.
//   SymbolicGraph: {single_pass, slots, entry, segments:[{id,entering,ops,selects,writes,feeds,
//     fetches,next}]}.
// Counts are exact integers, so a consumer can reconstruct every count of the graph (but for the
// outputs' per-variant counts of a graph built op by op, which keeps none: 0, trace_graph.h).
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "terra/case_assignment.h"
#include "terra/graph_gen.h"
#include "terra/trace_graph.h"

namespace terra {

// A short label for a node: its op and innermost source line if known, else its key.
std::string label(const TraceGraph& graph, NodeId id);

nlohmann::json source_json(const SourceInfo* source);
nlohmann::json where_json(const SourceInfo* source);

nlohmann::json to_json(const TraceGraph& graph);
nlohmann::json to_json(const TraceGraph& graph, const CaseAssignment& cases);
nlohmann::json to_json(const SymbolicGraph& graph);

std::string to_dot(const TraceGraph& graph, const CaseAssignment& cases);

}  // namespace terra
