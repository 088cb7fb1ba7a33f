using System;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// The wire under SidecarClient. Messages are xlm.v1 messages in protobuf's JSON mapping, so the
    /// typed layer above is shared by every transport (the WebSocket bridge here; gRPC elsewhere).
    /// </summary>
    public interface ISidecarTransport : IDisposable
    {
        /// <summary>Where the daemon is, for messages and logs.</summary>
        string Address { get; }

        /// <summary>Connect and authenticate now instead of on the first call.</summary>
        Task ConnectAsync(CancellationToken cancellationToken);

        /// <summary>A unary call: the response message. Throws SidecarException for a refused call and
        /// OperationCanceledException when `cancellationToken` cancels it.</summary>
        Task<JsonObject> CallAsync(string method, JsonObject request, CancellationToken cancellationToken);

        /// <summary>A server-streaming call. `onMessage` runs for each message, in order, on a transport
        /// thread (never concurrently for one call). Completes when the stream ends. Cancelling
        /// `cancellationToken` cancels the call on the daemon too.</summary>
        Task StreamAsync(string method, JsonObject request, Action<JsonObject> onMessage, CancellationToken cancellationToken);
    }
}
