using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// Sends budget changes one at a time, and only the newest: a SetBudget may reload the model, so
    /// when a scene load and a quality change arrive together the daemon should re-plan once for the
    /// final state, not once per step. A request superseded while waiting completes with the result
    /// of the request that replaced it.
    /// </summary>
    public sealed class BudgetUpdater
    {
        readonly SidecarClient client;
        readonly object gate = new object();
        SetBudgetRequest pending;
        TaskCompletionSource<SetBudgetResponse> pendingDone;
        bool sending;

        public BudgetUpdater(SidecarClient client)
        {
            if (client == null)
                throw new ArgumentNullException("client");
            this.client = client;
        }

        /// <summary>The last budget the daemon confirmed, or null before the first.</summary>
        public SetBudgetResponse Applied { get; private set; }

        public Task<SetBudgetResponse> RequestAsync(SetBudgetRequest request)
        {
            if (request == null)
                throw new ArgumentNullException("request");
            TaskCompletionSource<SetBudgetResponse> done;
            bool start;
            lock (gate)
            {
                if (pendingDone == null)
                    pendingDone = new TaskCompletionSource<SetBudgetResponse>(TaskCreationOptions.RunContinuationsAsynchronously);
                pending = request;
                done = pendingDone;
                start = !sending;
                sending = true;
            }
            if (start)
                _ = Task.Run(() => SendAllAsync());
            return done.Task;
        }

        async Task SendAllAsync()
        {
            while (true)
            {
                SetBudgetRequest request;
                TaskCompletionSource<SetBudgetResponse> done;
                lock (gate)
                {
                    if (pending == null)
                    {
                        sending = false;
                        return;
                    }
                    request = pending;
                    done = pendingDone;
                    pending = null;
                    pendingDone = null;
                }
                try
                {
                    var response = await client.SetBudgetAsync(request).ConfigureAwait(false);
                    Applied = response;
                    done.TrySetResult(response);
                }
                catch (Exception e)
                {
                    done.TrySetException(e);
                }
            }
        }
    }

    /// <summary>Which VRAM budget applies: the scene's if it has one, else the quality level's, else the default.</summary>
    public sealed class BudgetTable
    {
        public string Default = "0";
        public readonly Dictionary<string, string> ByScene = new Dictionary<string, string>(StringComparer.Ordinal);
        public readonly Dictionary<string, string> ByQualityLevel = new Dictionary<string, string>(StringComparer.Ordinal);

        public string Choose(string scene, string qualityLevel)
        {
            string size;
            if (scene != null && ByScene.TryGetValue(scene, out size) && !string.IsNullOrEmpty(size))
                return size;
            if (qualityLevel != null && ByQualityLevel.TryGetValue(qualityLevel, out size) && !string.IsNullOrEmpty(size))
                return size;
            return Default;
        }
    }
}
