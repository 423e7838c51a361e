// The kernel's ZeroMQ server: xeus's shell-on-main-thread server with `stop_on_error` done the way
// the Jupyter protocol and its clients expect.
//
// After an execute_request fails (an exception or an interrupt) with stop_on_error, a kernel
// aborts the execute_requests that were queued behind it ("Run All" stops at the failing cell).
// xeus 2.4 does this after sending the error reply, by reading the shell socket for as long as
// requests keep coming in (50 ms apart), and answers each with a bare {"status": "error"} reply
// with no busy/idle status around it. Three consequences:
//   - a request the client sends after it has seen the error reply (the next cell, right after an
//     interrupt) can land in that loop and is thrown away;
//   - clients (JupyterLab, nbclient, jupyter_client's execute_interactive) consider a request
//     finished only once its idle status arrives, so they wait forever for the aborted one;
//   - queued requests of every type are aborted: a kernel_info_request, a completion or a widget's
//     comm_msg gets an "error" reply under a made-up message type.
// This server instead:
//   - takes the requests queued behind the failing one off the socket just before its error reply
//     is sent, so only requests sent before the client could see the error are affected;
//   - once the failing request is over (its idle status is out), aborts the held execute_requests
//     if the request asked for it: status busy, an execute_reply {"status": "aborted"}, status
//     idle, as ipykernel does; every other held request, and all of them without stop_on_error,
//     are handled as if they had just arrived, in the order they came.
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "xeus/xeus_context.hpp"
#include "xeus/xkernel_configuration.hpp"
#include "xeus/xmessage.hpp"
#include "xeus/xserver.hpp"
#include "xeus/xserver_shell_main.hpp"
#include "zmq.hpp"

namespace terra::kernel {

class server final : public xeus::xserver_shell_main {
 public:
  server(zmq::context_t& context, const xeus::xconfiguration& config,
         nl::json::error_handler_t error_handler);

 private:
  void send_shell_impl(xeus::xmessage message) override;
  void publish_impl(xeus::xpub_message message, xeus::channel channel) override;
  void abort_queue_impl(const listener& ignored, long polling_interval) override;

  // Handles the held requests, oldest first; runs on the shell (main) thread once the failing
  // request has published its idle status.
  void release_held();
  void send_aborted(xeus::xmessage request);
  void publish_status(const nl::json& parent_header, const std::string& state);

  struct held_request {
    xeus::xmessage message;
    bool abort = false;  // set when the failing request asked for stop_on_error
  };
  std::deque<held_request> m_held;
  std::string m_failed_request;  // msg_id of the last request whose execute_reply was an error
  nl::json m_reply_header;       // header of that reply: the kernel's user name and session
  std::string m_status_topic;    // the IOPub topic xeus publishes status messages under
  bool m_releasing = false;
};

// The server builder for xeus::xkernel (the signature of xeus::make_xserver_shell_main).
std::unique_ptr<xeus::xserver> make_server(xeus::xcontext& context,
                                           const xeus::xconfiguration& config,
                                           nl::json::error_handler_t error_handler);

}  // namespace terra::kernel
