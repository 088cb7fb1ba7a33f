using System;
using System.Collections.Generic;

namespace Xlm.Sidecar
{
    /// <summary>How to start `xlm-sidecar serve` beside the game.</summary>
    public sealed class SidecarLaunchOptions
    {
        /// <summary>The daemon's executable: a path, or a name found on PATH.</summary>
        public string ExecutablePath = "xlm-sidecar";
        /// <summary>A GGUF model; null serves the daemon's bundled default.</summary>
        public string ModelPath;
        /// <summary>A vision projector GGUF (--mmproj) for screenshot questions; null for none.</summary>
        public string ProjectorPath;
        /// <summary>VRAM the game grants at start: "512M", "3G", "0" (CPU only).</summary>
        public string Budget = "0";
        /// <summary>Most CPU threads per forward pass; null leaves the daemon's default.</summary>
        public int? MaxCpuThreads;
        /// <summary>gRPC port; 0 picks a free one. The WebSocket bridge takes the next one (or a free one with 0).</summary>
        public int Port;
        /// <summary>Serve gRPC on this Unix socket instead of a TCP port. The client here speaks the
        /// WebSocket bridge, which then listens on WebSocketPort (a free loopback port by default).</summary>
        public string SocketPath;
        /// <summary>The WebSocket bridge's port; null is the daemon's default (Port + 1, or free with Port 0).</summary>
        public int? WebSocketPort;
        /// <summary>The game's process id: the daemon exits within 2 s of its death. 0 is this process.</summary>
        public int ParentProcessId;
        /// <summary>The launch token (16+ visible ASCII characters); null makes a random one.</summary>
        public string Token;
        /// <summary>How long to wait for the model to load and the daemon to answer.</summary>
        public TimeSpan StartTimeout = TimeSpan.FromMinutes(3);
        /// <summary>How long calls in flight may finish when stopping, before the process is killed.</summary>
        public TimeSpan StopGrace = TimeSpan.FromSeconds(5);
        /// <summary>More `serve` flags, one argument per element (e.g. "--ctx", "8192").</summary>
        public List<string> ExtraArguments = new List<string>();
        /// <summary>More environment variables for the daemon (e.g. XLM_SIDECAR_PARALLEL).</summary>
        public Dictionary<string, string> Environment = new Dictionary<string, string>();
        public string WorkingDirectory;
    }
}
