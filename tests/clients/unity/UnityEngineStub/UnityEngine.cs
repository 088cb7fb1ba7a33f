// A minimal stand-in for the parts of UnityEngine the package's components use, with Unity's own
// signatures, so Runtime/Unity compiles here without Unity. It is not Unity: GameObjects hold
// components and run their Awake/OnEnable/OnDisable/OnDestroy by reflection as Unity does, events and
// logs work, and everything that needs a GPU or a window throws NotSupportedException. Tests that
// drive components through it (UnityComponentTests) say so.
using System;
using System.Collections;
using System.Collections.Generic;
using System.Reflection;

namespace UnityEngine
{
    public class Object
    {
        static readonly List<Object> Live = new List<Object>();

        public string name { get; set; }

        protected Object()
        {
            name = GetType().Name;
            lock (Live) Live.Add(this);
        }

        public static void Destroy(Object obj)
        {
            if (obj == null)
                return;
            var component = obj as Component;
            if (component != null)
                component.RunDestroy();
            var gameObject = obj as GameObject;
            if (gameObject != null)
                gameObject.DestroyComponents();
            lock (Live) Live.Remove(obj);
        }

        public static void DontDestroyOnLoad(Object target) { }

        public static T FindObjectOfType<T>() where T : Object
        {
            lock (Live)
                foreach (var o in Live)
                    if (o is T)
                        return (T)o;
            return null;
        }
    }

    public sealed class GameObject : Object
    {
        readonly List<Component> components = new List<Component>();

        public GameObject(string name)
        {
            this.name = name;
        }

        public T AddComponent<T>() where T : Component, new()
        {
            return AddComponentForTests<T>(null);
        }

        /// <summary>Stand-in only: `configure` plays the part of the scene's serialized fields, set before Awake.</summary>
        public T AddComponentForTests<T>(Action<T> configure) where T : Component, new()
        {
            var component = new T();
            component.gameObject = this;
            if (configure != null)
                configure(component);
            components.Add(component);
            component.Run("Awake");
            component.Run("OnEnable");
            return component;
        }

        public T GetComponent<T>() where T : Component
        {
            foreach (var c in components)
                if (c is T)
                    return (T)c;
            return null;
        }

        internal void DestroyComponents()
        {
            foreach (var c in components.ToArray())
                Destroy(c);
        }
    }

    public class Component : Object
    {
        public GameObject gameObject { get; internal set; }

        public T GetComponent<T>() where T : Component
        {
            return gameObject.GetComponent<T>();
        }

        internal void Run(string message)
        {
            // Unity calls these private methods by name; so does this stand-in.
            var method = GetType().GetMethod(message, BindingFlags.Instance | BindingFlags.Public | BindingFlags.NonPublic, null, Type.EmptyTypes, null);
            if (method != null)
                method.Invoke(this, null);
        }

        internal void RunDestroy()
        {
            Run("OnDisable");
            Run("OnDestroy");
        }
    }

    public class Behaviour : Component { }

    public class MonoBehaviour : Behaviour
    {
        public Coroutine StartCoroutine(IEnumerator routine)
        {
            throw new NotSupportedException("coroutines need Unity's player loop");
        }

        /// <summary>Runs Update once, as a frame would (stand-in only).</summary>
        public void RunFrameForTests()
        {
            Run("Update");
        }
    }

    public sealed class Coroutine { }

    public class YieldInstruction { }

    public sealed class WaitForEndOfFrame : YieldInstruction { }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class SerializeField : Attribute { }

    [AttributeUsage(AttributeTargets.Field, AllowMultiple = true)]
    public class PropertyAttribute : Attribute { }

    public sealed class HeaderAttribute : PropertyAttribute
    {
        public HeaderAttribute(string header) { }
    }

    public sealed class TooltipAttribute : PropertyAttribute
    {
        public TooltipAttribute(string tooltip) { }
    }

    public sealed class TextAreaAttribute : PropertyAttribute
    {
        public TextAreaAttribute(int minLines, int maxLines) { }
    }

    [AttributeUsage(AttributeTargets.Class)]
    public sealed class DisallowMultipleComponent : Attribute { }

    [AttributeUsage(AttributeTargets.Class, AllowMultiple = true)]
    public sealed class RequireComponent : Attribute
    {
        public RequireComponent(Type requiredComponent) { }
    }

    public enum KeyCode { Escape = 27, F2 = 283, F5 = 286, F9 = 290 }

    public static class Input
    {
        public static bool GetKeyDown(KeyCode key) { return false; }
    }

    public static class PlayerPrefs
    {
        static readonly System.Collections.Generic.Dictionary<string, string> strings = new System.Collections.Generic.Dictionary<string, string>();
        public static void SetString(string key, string value) { strings[key] = value; }
        public static string GetString(string key, string defaultValue) { string v; return strings.TryGetValue(key, out v) ? v : defaultValue; }
    }

    [AttributeUsage(AttributeTargets.Class)]
    public sealed class AddComponentMenu : Attribute
    {
        public AddComponentMenu(string menuName) { }
    }

    public enum RuntimePlatform
    {
        OSXEditor = 0,
        OSXPlayer = 1,
        WindowsPlayer = 2,
        WindowsEditor = 7,
        LinuxPlayer = 13,
        LinuxEditor = 16,
    }

    public static class Application
    {
        public static RuntimePlatform platform { get { return RuntimePlatform.LinuxPlayer; } }
        public static string streamingAssetsPath { get { return "/nonexistent/StreamingAssets"; } }
        /// <summary>-1 (as fast as it goes) until set, as in Unity.</summary>
        public static int targetFrameRate { get; set; } = -1;
    }

    public static class Time
    {
        static float unscaled = 1f / 60f;

        public static float unscaledDeltaTime { get { return unscaled; } }

        /// <summary>Stand-in only: the length of the frames RunFrameForTests plays.</summary>
        public static void SetUnscaledDeltaTimeForTests(float seconds) { unscaled = seconds; }
    }

    public static class Debug
    {
        /// <summary>What was logged as an error or exception (stand-in only, for tests).</summary>
        public static readonly List<string> Errors = new List<string>();

        public static void Log(object message) { Console.WriteLine("[Unity log] " + message); }
        public static void LogWarning(object message) { Console.WriteLine("[Unity warning] " + message); }

        public static void LogError(object message)
        {
            lock (Errors) Errors.Add(Convert.ToString(message));
            Console.WriteLine("[Unity error] " + message);
        }

        public static void LogException(Exception exception, Object context)
        {
            lock (Errors) Errors.Add(exception.ToString());
            Console.WriteLine("[Unity exception] " + exception);
        }
    }

    public struct Rect
    {
        public float x, y, width, height;

        public Rect(float x, float y, float width, float height)
        {
            this.x = x;
            this.y = y;
            this.width = width;
            this.height = height;
        }
    }

    public enum TextureFormat { RGBA32 = 4, ARGB32 = 5 }

    public enum RenderTextureFormat { ARGB32 = 0 }

    public enum RenderTextureReadWrite { Default = 0, Linear = 1, sRGB = 2 }

    public class Texture : Object
    {
        public virtual int width { get { throw new NotSupportedException("textures need a GPU"); } }
        public virtual int height { get { throw new NotSupportedException("textures need a GPU"); } }
    }

    public sealed class Texture2D : Texture
    {
        public Texture2D(int width, int height, TextureFormat textureFormat, bool mipChain)
        {
            throw new NotSupportedException("textures need a GPU");
        }

        public void ReadPixels(Rect source, int destX, int destY, bool recalculateMipMaps) { throw new NotSupportedException(); }
        public byte[] GetRawTextureData() { throw new NotSupportedException(); }
    }

    public sealed class RenderTexture : Texture
    {
        RenderTexture() { }

        public static RenderTexture active { get; set; }

        public static RenderTexture GetTemporary(int width, int height, int depthBuffer, RenderTextureFormat format, RenderTextureReadWrite readWrite)
        {
            throw new NotSupportedException("render textures need a GPU");
        }

        public static void ReleaseTemporary(RenderTexture temp) { }
    }

    public static class Graphics
    {
        public static void Blit(Texture source, RenderTexture dest) { throw new NotSupportedException(); }
    }

    public static class ScreenCapture
    {
        public static Texture2D CaptureScreenshotAsTexture() { throw new NotSupportedException("screenshots need a window"); }
    }

    public static class QualitySettings
    {
        static int level;

        public static string[] names { get { return new[] { "Low", "Medium", "High", "Ultra" }; } }
        public static int GetQualityLevel() { return level; }
        public static void SetQualityLevel(int index, bool applyExpensiveChanges) { level = index; }
    }
}

namespace UnityEngine.Events
{
    public delegate void UnityAction();
    public delegate void UnityAction<T0>(T0 arg0);
    public delegate void UnityAction<T0, T1>(T0 arg0, T1 arg1);

    public class UnityEvent
    {
        readonly List<UnityAction> listeners = new List<UnityAction>();
        public void AddListener(UnityAction call) { listeners.Add(call); }
        public void RemoveListener(UnityAction call) { listeners.Remove(call); }
        public void Invoke() { foreach (var l in listeners.ToArray()) l(); }
    }

    public class UnityEvent<T0>
    {
        readonly List<UnityAction<T0>> listeners = new List<UnityAction<T0>>();
        public void AddListener(UnityAction<T0> call) { listeners.Add(call); }
        public void RemoveListener(UnityAction<T0> call) { listeners.Remove(call); }
        public void Invoke(T0 arg0) { foreach (var l in listeners.ToArray()) l(arg0); }
    }
}

namespace UnityEngine.SceneManagement
{
    using UnityEngine.Events;

    public struct Scene
    {
        internal string sceneName;
        public string name { get { return sceneName; } }
    }

    public static class SceneManager
    {
        static Scene active = new Scene { sceneName = "Main" };

        public static event UnityAction<Scene, Scene> activeSceneChanged;

        public static Scene GetActiveScene() { return active; }

        /// <summary>Stand-in only: what a scene load does to the active scene.</summary>
        public static void LoadSceneForTests(string name)
        {
            var previous = active;
            active = new Scene { sceneName = name };
            var handler = activeSceneChanged;
            if (handler != null) handler(previous, active);
        }
    }
}
