using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;
using UnityEngine;
using UnityEngine.SceneManagement;

namespace Xlm.Sidecar.Unity
{
    /// <summary>
    /// Tells the daemon how much VRAM the game can spare whenever the active scene or the quality
    /// level changes: a scene's entry wins, then the quality level's, then the default. Changes that
    /// come together (a scene load that also changes quality) become one SetBudget, since each may
    /// make the daemon reload the model.
    /// </summary>
    [AddComponentMenu("XLM Sidecar/VRAM Budget")]
    public sealed class VramBudget : MonoBehaviour
    {
        [Serializable]
        public sealed class Entry
        {
            [Tooltip("A scene name, or a quality level's name (Project Settings > Quality).")]
            public string name = "";
            [Tooltip("512M, 3G, 0 = CPU only.")]
            public string vram = "";
        }

        [SerializeField] SidecarLauncher launcher;
        [SerializeField] string defaultVram = "2G";
        [SerializeField] List<Entry> byQualityLevel = new List<Entry>();
        [SerializeField] List<Entry> byScene = new List<Entry>();
        [Tooltip("Most CPU threads per forward pass; 0 removes the cap, -1 leaves it as it is.")]
        [SerializeField] int maxCpuThreads = -1;

        BudgetUpdater updater;
        int lastQualityLevel = -1;

        public string DefaultVram { get { return defaultVram; } set { defaultVram = value; } }
        public int MaxCpuThreads { get { return maxCpuThreads; } set { maxCpuThreads = value; } }
        public SidecarLauncher Launcher { get { return launcher; } set { launcher = value; } }
        public List<Entry> ByQualityLevel { get { return byQualityLevel; } }
        public List<Entry> ByScene { get { return byScene; } }
        /// <summary>The budget the daemon last confirmed.</summary>
        public SetBudgetResponse Applied { get { return updater != null ? updater.Applied : null; } }

        /// <summary>On the main thread, with what the daemon put in force (and whether it reloaded).</summary>
        public event Action<SetBudgetResponse> BudgetApplied;
        public event Action<Exception> BudgetFailed;

        void OnEnable()
        {
            SceneManager.activeSceneChanged += OnActiveSceneChanged;
            lastQualityLevel = QualitySettings.GetQualityLevel();
            Apply();
        }

        void OnDisable()
        {
            SceneManager.activeSceneChanged -= OnActiveSceneChanged;
        }

        void Update()
        {
            // Older Unity versions have no event for a quality change; a comparison a frame is cheap.
            var level = QualitySettings.GetQualityLevel();
            if (level == lastQualityLevel)
                return;
            lastQualityLevel = level;
            Apply();
        }

        void OnActiveSceneChanged(Scene previous, Scene next)
        {
            Apply();
        }

        /// <summary>Send the budget the current scene and quality level call for (errors go to the log).</summary>
        public void Apply()
        {
            var vram = Choose(SceneManager.GetActiveScene().name, QualityLevelName(QualitySettings.GetQualityLevel()));
            Report(SendAsync(SetBudgetRequest.Vram(vram, Threads())));
        }

        /// <summary>Grant a budget now, whatever the tables say (until the next scene or quality change).</summary>
        public Task<SetBudgetResponse> SetAsync(string vram)
        {
            return Report(SendAsync(SetBudgetRequest.Vram(vram, Threads())));
        }

        /// <summary>Let the daemon follow the GPU's free memory, keeping `reserveBytes` for the game.</summary>
        public Task<SetBudgetResponse> FollowFreeVramAsync(ulong reserveBytes)
        {
            return Report(SendAsync(SetBudgetRequest.FollowFreeVram(reserveBytes, Threads())));
        }

        /// <summary>The budget for a scene and quality level, by the tables.</summary>
        public string Choose(string scene, string qualityLevel)
        {
            var table = new BudgetTable { Default = defaultVram };
            foreach (var e in byQualityLevel)
                table.ByQualityLevel[e.name] = e.vram;
            foreach (var e in byScene)
                table.ByScene[e.name] = e.vram;
            return table.Choose(scene, qualityLevel);
        }

        async Task<SetBudgetResponse> SendAsync(SetBudgetRequest request)
        {
            var client = await SidecarLauncher.Find(launcher).WhenReady;
            if (updater == null)
                updater = new BudgetUpdater(client);
            return await updater.RequestAsync(request);
        }

        Task<SetBudgetResponse> Report(Task<SetBudgetResponse> sent)
        {
            sent.ContinueWith(t =>
            {
                if (t.IsFaulted)
                {
                    var e = t.Exception.GetBaseException();
                    Debug.LogException(e, this);
                    var failed = BudgetFailed;
                    if (failed != null) failed(e);
                }
                else if (t.Status == TaskStatus.RanToCompletion)
                {
                    var applied = BudgetApplied;
                    if (applied != null) applied(t.Result);
                }
            }, SynchronizationContext.Current != null ? TaskScheduler.FromCurrentSynchronizationContext() : TaskScheduler.Default);
            return sent;
        }

        uint? Threads()
        {
            return maxCpuThreads < 0 ? (uint?)null : (uint)maxCpuThreads;
        }

        static string QualityLevelName(int level)
        {
            var names = QualitySettings.names;
            return level >= 0 && level < names.Length ? names[level] : null;
        }
    }
}
