#include "server.hpp"

#include <utility>

namespace terra::kernel {

namespace {

std::string msg_type(const nl::json& header) { return header.value("msg_type", std::string()); }

std::string msg_id(const nl::json& header) { return header.value("msg_id", std::string()); }

}  // namespace

server::server(zmq::context_t& context, const xeus::xconfiguration& config,
               nl::json::error_handler_t error_handler)
    : xeus::xserver_shell_main(context, config, error_handler) {}

void server::send_shell_impl(xeus::xmessage message) {
  // xeus calls abort_queue only when the reply says "error", and reads a missing status so.
  if (msg_type(message.header()) == "execute_reply" &&
      message.content().value("status", std::string("error")) == "error") {
    // What is queued now was sent before the client could see this reply. The base class reads
    // the socket until it is empty (an interval of 0: no waiting for more).
    xeus::xserver_zmq_split::abort_queue_impl(
        [this](xeus::xmessage queued) { m_held.push_back({std::move(queued), false}); }, 0);
    m_failed_request = msg_id(message.parent_header());
    m_reply_header = message.header();
  }
  xeus::xserver_zmq_split::send_shell_impl(std::move(message));
}

void server::abort_queue_impl(const listener& /*ignored*/, long /*polling_interval*/) {
  // The failing request asked for stop_on_error: everything held so far was queued behind it.
  // Nothing more is read from the socket: later requests were sent after the error reply.
  for (held_request& held : m_held) held.abort = true;
}

void server::publish_impl(xeus::xpub_message message, xeus::channel channel) {
  bool failed_request_done = false;
  if (channel == xeus::channel::SHELL && msg_type(message.header()) == "status") {
    m_status_topic = message.topic();
    failed_request_done = !m_failed_request.empty() &&
                          message.content().value("execution_state", std::string()) == "idle" &&
                          msg_id(message.parent_header()) == m_failed_request;
  }
  xeus::xserver_zmq_split::publish_impl(std::move(message), channel);
  if (failed_request_done) {
    m_failed_request.clear();
    release_held();
  }
}

void server::release_held() {
  // A held request that fails holds what is queued behind it in turn: this loop (not a nested
  // one) handles those too, keeping arrival order.
  if (m_releasing) return;
  m_releasing = true;
  while (!m_held.empty()) {
    held_request held = std::move(m_held.front());
    m_held.pop_front();
    if (held.abort && msg_type(held.message.header()) == "execute_request") {
      send_aborted(std::move(held.message));
    } else {
      notify_shell_listener(std::move(held.message));
    }
  }
  m_releasing = false;
}

void server::send_aborted(xeus::xmessage request) {
  publish_status(request.header(), "busy");
  const nl::json aborted = {{"status", "aborted"}};
  xeus::xmessage reply(request.identities(),
                       xeus::make_header("execute_reply", m_reply_header.value("username", ""),
                                         m_reply_header.value("session", "")),
                       request.header(), aborted, aborted, xeus::buffer_sequence());
  xeus::xserver_zmq_split::send_shell_impl(std::move(reply));
  publish_status(request.header(), "idle");
}

void server::publish_status(const nl::json& parent_header, const std::string& state) {
  xeus::xpub_message status(m_status_topic,
                            xeus::make_header("status", m_reply_header.value("username", ""),
                                              m_reply_header.value("session", "")),
                            parent_header, nl::json::object(), {{"execution_state", state}},
                            xeus::buffer_sequence());
  xeus::xserver_zmq_split::publish_impl(std::move(status), xeus::channel::SHELL);
}

std::unique_ptr<xeus::xserver> make_server(xeus::xcontext& context,
                                           const xeus::xconfiguration& config,
                                           nl::json::error_handler_t error_handler) {
  return std::make_unique<server>(context.get_wrapped_context<zmq::context_t>(), config,
                                  error_handler);
}

}  // namespace terra::kernel
