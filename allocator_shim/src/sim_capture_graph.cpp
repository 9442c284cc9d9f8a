#include "sim_capture_graph.h"

#include <algorithm>
#include <iterator>

namespace npl::sim {

void CaptureGraphs::begin(Stream stream) {
    if (capturing(stream)) return;
    members_[stream] = Member{++captures_, {}};
}

void CaptureGraphs::end(Stream stream) {
    auto it = members_.find(stream);
    if (it == members_.end()) return;
    uint64_t capture = it->second.capture;
    for (auto m = members_.begin(); m != members_.end();) {
        m = m->second.capture == capture ? members_.erase(m) : std::next(m);
    }
}

void CaptureGraphs::add_node(Stream stream) {
    auto it = members_.find(stream);
    if (it == members_.end()) return;
    Member& m = it->second;
    nodes_.push_back(Node{m.capture, m.frontier});
    Node* node = &nodes_.back();
    index_[node] = nodes_.size() - 1;
    m.frontier.assign(1, node);
}

void CaptureGraphs::record(const void* event, Stream stream) {
    auto it = members_.find(stream);
    if (it == members_.end()) {
        recorded_.erase(event);  // recorded outside a capture: an ordinary event again
        return;
    }
    recorded_[event] = it->second;
}

bool CaptureGraphs::wait(Stream stream, const void* event) {
    auto e = recorded_.find(event);
    if (e == recorded_.end()) return true;  // an event of no capture: no edge in any graph
    auto it = members_.find(stream);
    if (it == members_.end()) {
        members_[stream] = e->second;  // joins the event's capture
        return true;
    }
    Member& m = it->second;
    if (m.capture != e->second.capture) return false;
    for (Node* n : e->second.frontier) {
        if (std::find(m.frontier.begin(), m.frontier.end(), n) == m.frontier.end()) m.frontier.push_back(n);
    }
    return true;
}

void CaptureGraphs::forget_event(const void* event) { recorded_.erase(event); }

void CaptureGraphs::info(Stream stream, CaptureInfo* out) const {
    *out = CaptureInfo{};
    auto it = members_.find(stream);
    if (it == members_.end()) return;
    out->capturing = true;
    out->id = it->second.capture;
    out->frontier.assign(it->second.frontier.begin(), it->second.frontier.end());
}

bool CaptureGraphs::parents(GraphNode node, std::vector<GraphNode>* out) const {
    auto it = index_.find(static_cast<const Node*>(node));
    if (it == index_.end()) return false;
    const Node& n = nodes_[it->second];
    out->assign(n.parents.begin(), n.parents.end());
    return true;
}

void CaptureGraphs::clear() {
    nodes_.clear();
    index_.clear();
    members_.clear();
    recorded_.clear();
}

}  // namespace npl::sim
