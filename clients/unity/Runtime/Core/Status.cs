using System.Collections.Generic;

namespace Xlm.Sidecar
{
    // Budget, schedule and status messages. Each keeps the JSON it was read from (`Json`), so fields
    // a newer daemon adds are readable before this client knows them.

    public enum EnginePhase
    {
        Unspecified = 0,
        Loading = 1,
        Ready = 2,
        /// <summary>Applying a new schedule; requests queue and resume after.</summary>
        Reloading = 3,
        /// <summary>Shutting down: new calls get UNAVAILABLE.</summary>
        Draining = 4,
        /// <summary>Listening, the model not loaded yet; Loading, then Ready follow. Calls that
        /// generate get UNAVAILABLE with a retry hint until Ready.</summary>
        Starting = 5,
    }

    public enum Placement
    {
        Unspecified = 0,
        FullGpu = 1,
        Static = 2,
        Dynamic = 3,
        GpuStreaming = 4,
        CpuOnly = 5,
    }

    public sealed class Budget
    {
        /// <summary>VRAM the daemon may use; 0 is CPU only.</summary>
        public ulong VramBytes;
        /// <summary>0 is no cap.</summary>
        public uint MaxCpuThreads;
        public bool AutoVram;
        public ulong AutoReserveBytes;
        /// <summary>Host memory the daemon may hold; 0 is no budget.</summary>
        public ulong RamBytes;

        internal static Budget FromJson(JsonObject json)
        {
            json = json ?? new JsonObject();
            return new Budget
            {
                VramBytes = json.GetUInt64("vramBytes"),
                MaxCpuThreads = json.GetUInt32("maxCpuThreads"),
                AutoVram = json.GetBool("autoVram"),
                AutoReserveBytes = json.GetUInt64("autoReserveBytes"),
                RamBytes = json.GetUInt64("ramBytes"),
            };
        }
    }

    /// <summary>The plan for forward passes of up to MaxTokens new tokens.</summary>
    public sealed class TierPlan
    {
        public uint MaxTokens;
        /// <summary>"TIER_PHASE_DECODE" or "TIER_PHASE_PREFILL".</summary>
        public string Phase;
        public Placement Placement;
        public uint Threads;
        public double PredictedTokensPerS;
        public double PredictedMsPerPass;
    }

    public sealed class Schedule
    {
        public List<TierPlan> Tiers = new List<TierPlan>();
        public Dictionary<string, ulong> VramBytesByComponent = new Dictionary<string, ulong>();
        public string KvType;
        public bool FlashAttention;
        public uint MicroBatch;

        internal static Schedule FromJson(JsonObject json)
        {
            json = json ?? new JsonObject();
            var schedule = new Schedule
            {
                KvType = json.GetString("kvType"),
                FlashAttention = json.GetBool("flashAttention"),
                MicroBatch = json.GetUInt32("microBatch"),
            };
            foreach (var item in json.GetArray("tiers"))
            {
                var tier = item as JsonObject;
                if (tier == null) continue;
                schedule.Tiers.Add(new TierPlan
                {
                    MaxTokens = tier.GetUInt32("maxTokens"),
                    Phase = tier.GetString("phase"),
                    Placement = ParsePlacement(tier.GetString("placement")),
                    Threads = tier.GetUInt32("threads"),
                    PredictedTokensPerS = tier.GetDouble("predictedTokensPerS"),
                    PredictedMsPerPass = tier.GetDouble("predictedMsPerPass"),
                });
            }
            var components = json.GetObject("vramBytesByComponent");
            if (components != null)
                foreach (var key in components.Keys)
                    schedule.VramBytesByComponent[key] = components.GetUInt64(key);
            return schedule;
        }

        static Placement ParsePlacement(string name)
        {
            switch (name)
            {
                case "PLACEMENT_FULL_GPU": return Placement.FullGpu;
                case "PLACEMENT_STATIC": return Placement.Static;
                case "PLACEMENT_DYNAMIC": return Placement.Dynamic;
                case "PLACEMENT_GPU_STREAMING": return Placement.GpuStreaming;
                case "PLACEMENT_CPU_ONLY": return Placement.CpuOnly;
                default: return Placement.Unspecified;
            }
        }
    }

    public sealed class SetBudgetResponse
    {
        public Budget Budget;
        public Schedule Schedule;
        /// <summary>Whether the model was reloaded with a new placement.</summary>
        public bool Reloaded;
        /// <summary>How long generation paused for the change.</summary>
        public double PauseMs;
        public JsonObject Json;

        internal static SetBudgetResponse FromJson(JsonObject json)
        {
            return new SetBudgetResponse
            {
                Budget = Budget.FromJson(json.GetObject("budget")),
                Schedule = Schedule.FromJson(json.GetObject("schedule")),
                Reloaded = json.GetBool("reloaded"),
                PauseMs = json.GetDouble("pauseMs"),
                Json = json,
            };
        }
    }

    public sealed class ModelInfo
    {
        public string Path;
        public string Name;
        public string Architecture;
        public ulong Parameters;
        public uint TrainedContext;
        public bool VisionAvailable;
    }

    public sealed class SessionInfo
    {
        public string SessionId;
        public uint Tokens;
        public long LastUsedUnixMs;
        /// <summary>False when moved to host memory (restored on its next turn).</summary>
        public bool InKvCache;
    }

    /// <summary>A request the daemon holds, and where it is: why an NPC has not answered yet.</summary>
    public sealed class RequestInfo
    {
        public string RequestId;
        public string SessionId;
        /// <summary>"WAITING_FOR_SEQUENCE", "WAITING_FOR_TURN", "WAITING_FOR_IMAGE", "WAITING_FOR_PREFIX",
        /// "PREFILLING" or "DECODING" (the proto's RequestState without its prefix).</summary>
        public string State;
        public uint PromptTokens;
        /// <summary>Of PromptTokens, those in the KV cache (reused or computed).</summary>
        public uint PromptTokensDone;
        public uint TokensGenerated;
        public double AgeMs;
    }

    /// <summary>A snapshot for a debug overlay (GetStatus).</summary>
    public sealed class Status
    {
        public string Version;
        public EnginePhase Phase;
        public ModelInfo Model;
        public Budget Budget;
        public Schedule Schedule;
        public ulong HostResidentBytes;
        public ulong VramUsedBytes;
        public ulong KvCacheBytes;
        public double DecodeTokensPerS;
        public uint RequestsActive;
        public uint RequestsQueued;
        public List<SessionInfo> Sessions = new List<SessionInfo>();
        /// <summary>Every request the daemon holds, oldest first.</summary>
        public List<RequestInfo> Requests = new List<RequestInfo>();
        public uint MaxSessions;
        public uint ContextPerSession;
        public uint MaxTokensPerRequest;
        public double UptimeS;
        public List<string> ListenAddresses = new List<string>();
        /// <summary>What the daemon's frame-time guard sees of the game and does about it.</summary>
        public FrameGuardState FrameGuard;
        /// <summary>Everything the daemon sent, including fields this client does not name.</summary>
        public JsonObject Json;

        internal static Status FromJson(JsonObject json)
        {
            var model = json.GetObject("model") ?? new JsonObject();
            var memory = json.GetObject("memory") ?? new JsonObject();
            var throughput = json.GetObject("throughput") ?? new JsonObject();
            var limits = json.GetObject("limits") ?? new JsonObject();
            var status = new Status
            {
                Version = json.GetString("version"),
                Phase = ParsePhase(json.GetString("phase")),
                Model = new ModelInfo
                {
                    Path = model.GetString("path"),
                    Name = model.GetString("name"),
                    Architecture = model.GetString("architecture"),
                    Parameters = model.GetUInt64("parameters"),
                    TrainedContext = model.GetUInt32("trainedContext"),
                    VisionAvailable = model.GetBool("visionAvailable"),
                },
                Budget = Budget.FromJson(json.GetObject("budget")),
                Schedule = Schedule.FromJson(json.GetObject("schedule")),
                HostResidentBytes = memory.GetUInt64("hostResidentBytes"),
                VramUsedBytes = memory.GetUInt64("vramUsedBytes"),
                KvCacheBytes = memory.GetUInt64("kvCacheBytes"),
                DecodeTokensPerS = throughput.GetDouble("decodeTokensPerS"),
                RequestsActive = throughput.GetUInt32("requestsActive"),
                RequestsQueued = throughput.GetUInt32("requestsQueued"),
                MaxSessions = limits.GetUInt32("maxSessions"),
                ContextPerSession = limits.GetUInt32("contextPerSession"),
                MaxTokensPerRequest = limits.GetUInt32("maxTokensPerRequest"),
                UptimeS = json.GetDouble("uptimeS"),
                FrameGuard = FrameGuardState.FromJson(json.GetObject("frameGuard")),
                Json = json,
            };
            foreach (var item in json.GetArray("sessions"))
            {
                var s = item as JsonObject;
                if (s == null) continue;
                status.Sessions.Add(new SessionInfo
                {
                    SessionId = s.GetString("sessionId"),
                    Tokens = s.GetUInt32("tokens"),
                    LastUsedUnixMs = s.GetInt64("lastUsedUnixMs"),
                    InKvCache = s.GetBool("inKvCache"),
                });
            }
            foreach (var item in json.GetArray("requests"))
            {
                var r = item as JsonObject;
                if (r == null) continue;
                var state = r.GetString("state");
                status.Requests.Add(new RequestInfo
                {
                    RequestId = r.GetString("requestId"),
                    SessionId = r.GetString("sessionId"),
                    State = state.StartsWith("REQUEST_STATE_") ? state.Substring("REQUEST_STATE_".Length) : state,
                    PromptTokens = r.GetUInt32("promptTokens"),
                    PromptTokensDone = r.GetUInt32("promptTokensDone"),
                    TokensGenerated = r.GetUInt32("tokensGenerated"),
                    AgeMs = r.GetDouble("ageMs"),
                });
            }
            foreach (var item in json.GetArray("listenAddresses"))
                if (item is string)
                    status.ListenAddresses.Add((string)item);
            return status;
        }

        internal static EnginePhase ParsePhase(string name)
        {
            switch (name)
            {
                case "ENGINE_PHASE_LOADING": return EnginePhase.Loading;
                case "ENGINE_PHASE_READY": return EnginePhase.Ready;
                case "ENGINE_PHASE_RELOADING": return EnginePhase.Reloading;
                case "ENGINE_PHASE_DRAINING": return EnginePhase.Draining;
                case "ENGINE_PHASE_STARTING": return EnginePhase.Starting;
                default: return EnginePhase.Unspecified;
            }
        }
    }

    /// <summary>One WatchState event: the state at first, then each change.</summary>
    public sealed class StateEvent
    {
        public long UnixMs;
        public EnginePhase Phase;
        public Budget Budget;
        public Schedule Schedule;
        /// <summary>Why it was sent: "initial", "budget", "reload", ...</summary>
        public string Reason;
        public JsonObject Json;

        internal static StateEvent FromJson(JsonObject json)
        {
            return new StateEvent
            {
                UnixMs = json.GetInt64("unixMs"),
                Phase = Status.ParsePhase(json.GetString("phase")),
                Budget = Budget.FromJson(json.GetObject("budget")),
                Schedule = Schedule.FromJson(json.GetObject("schedule")),
                Reason = json.GetString("reason"),
                Json = json,
            };
        }
    }
}
