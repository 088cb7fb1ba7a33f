using System;

namespace Xlm.Sidecar
{
    /// <summary>gRPC status codes, as the daemon reports errors on every transport.</summary>
    public enum SidecarStatusCode
    {
        Ok = 0,
        Cancelled = 1,
        Unknown = 2,
        InvalidArgument = 3,
        DeadlineExceeded = 4,
        NotFound = 5,
        AlreadyExists = 6,
        PermissionDenied = 7,
        ResourceExhausted = 8,
        FailedPrecondition = 9,
        Aborted = 10,
        OutOfRange = 11,
        Unimplemented = 12,
        Internal = 13,
        Unavailable = 14,
        DataLoss = 15,
        Unauthenticated = 16,
    }

    /// <summary>
    /// A call the daemon refused or could not finish. `Code` says why (INVALID_ARGUMENT for a bad
    /// request, RESOURCE_EXHAUSTED when full, NOT_FOUND for an unknown session, FAILED_PRECONDITION
    /// when e.g. no vision projector is loaded, UNAVAILABLE when the daemon is gone or draining).
    /// A call cancelled through its CancellationToken throws OperationCanceledException instead.
    /// </summary>
    public class SidecarException : Exception
    {
        public SidecarStatusCode Code { get; private set; }
        /// <summary>The RPC that failed ("Generate"), or null for the connection itself.</summary>
        public string Method { get; private set; }
        /// <summary>The daemon's own words, without the prefix this client adds.</summary>
        public string Detail { get; private set; }

        public SidecarException(SidecarStatusCode code, string method, string detail, Exception inner = null)
            : base(Describe(code, method, detail), inner)
        {
            Code = code;
            Method = method;
            Detail = detail;
        }

        static string Describe(SidecarStatusCode code, string method, string detail)
        {
            return (method != null ? method + " failed: " : "") + CodeName(code) + ": " + detail;
        }

        /// <summary>"INVALID_ARGUMENT" for InvalidArgument: the names the daemon and its logs use.</summary>
        public static string CodeName(SidecarStatusCode code)
        {
            var name = code.ToString();
            var b = new System.Text.StringBuilder();
            for (var i = 0; i < name.Length; i++)
            {
                if (i > 0 && char.IsUpper(name[i])) b.Append('_');
                b.Append(char.ToUpperInvariant(name[i]));
            }
            return b.ToString();
        }

        /// <summary>The code for a name the daemon sent; Unknown for a name this client does not know.</summary>
        public static SidecarStatusCode ParseCode(string name)
        {
            foreach (SidecarStatusCode code in Enum.GetValues(typeof(SidecarStatusCode)))
                if (CodeName(code) == name)
                    return code;
            return SidecarStatusCode.Unknown;
        }

        /// <summary>The right exception type for a status code.</summary>
        public static SidecarException For(SidecarStatusCode code, string method, string detail, Exception inner = null)
        {
            if (code == SidecarStatusCode.Unauthenticated)
                return new SidecarAuthenticationException(method, detail, inner);
            if (code == SidecarStatusCode.Unavailable)
                return new SidecarUnavailableException(method, detail, inner);
            return new SidecarException(code, method, detail, inner);
        }
    }

    /// <summary>The daemon refused the token (UNAUTHENTICATED): wrong token, or one from another launch.</summary>
    public sealed class SidecarAuthenticationException : SidecarException
    {
        public SidecarAuthenticationException(string method, string detail, Exception inner = null)
            : base(SidecarStatusCode.Unauthenticated, method, detail, inner) { }
    }

    /// <summary>No daemon answered, the connection dropped, or the daemon is shutting down (UNAVAILABLE).</summary>
    public sealed class SidecarUnavailableException : SidecarException
    {
        public SidecarUnavailableException(string method, string detail, Exception inner = null)
            : base(SidecarStatusCode.Unavailable, method, detail, inner) { }
    }

    /// <summary>The daemon process could not be started or did not become healthy.</summary>
    public sealed class SidecarLaunchException : Exception
    {
        /// <summary>The daemon's exit code when it exited: 2 bad flags, 3 model missing or broken, 4 port or socket taken.</summary>
        public int? ExitCode { get; private set; }
        /// <summary>The daemon's last log lines, for the player log.</summary>
        public string LogTail { get; private set; }

        public SidecarLaunchException(string message, int? exitCode = null, string logTail = null, Exception inner = null)
            : base(message + (string.IsNullOrEmpty(logTail) ? "" : "\nlast daemon log lines:\n" + logTail), inner)
        {
            ExitCode = exitCode;
            LogTail = logTail ?? "";
        }
    }
}
