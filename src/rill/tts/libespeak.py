"""libespeak-ng in-process: the library and its data from the espeakng-loader wheel, loaded and
initialised once, driven through its C API (speak_lib.h) with ctypes. No subprocess per request.

    with libespeak.lock:
        lib = libespeak.lib()            # espeak_Initialize has run; the synth callback is rill's
        ...
    libespeak.phonemize("Hello there.", "en-us")   # "həlˈoʊ ðˈɛɹ"  (IPA, clause by clause)

The library keeps global state (the current voice, the parameters, one callback), so every caller
holds `lock` around a sequence of calls. In rill the speech-out worker thread is the only synthesizer;
phonemize (Kokoro's text front end) runs on that thread too, the lock is for tests and the offline API.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

AUDIO_OUTPUT_SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT: samples to the callback, espeak_Synth returns when done
POS_CHARACTER = 1
CHARS_UTF8 = 1
PHONEMES_IPA = 0x02  # espeak_TextToPhonemes phonememode bit 1: IPA as UTF-8
# espeak_PARAMETER
RATE, VOLUME, PITCH, RANGE, WORDGAP = 1, 2, 3, 4, 7
RATE_MIN, RATE_MAX = 80, 450  # words a minute, espeakRATE_MINIMUM / _MAXIMUM

SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

lock = threading.RLock()
_lib: ctypes.CDLL | None = None
_rate_hz = 0
_chunks: list[np.ndarray] = []  # the callback's samples for the Synth call in progress (under lock)


@SYNTH_CALLBACK
def _on_samples(wav, num_samples, _events) -> int:
    if wav and num_samples > 0:
        _chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
    return 0  # 0: go on


def lib() -> ctypes.CDLL:
    """The initialised library (loaded on first use; raises RuntimeError if the wheel is missing)."""
    global _lib, _rate_hz
    with lock:
        if _lib is None:
            try:
                import espeakng_loader
            except ImportError as exc:  # pragma: no cover - a main dependency
                raise RuntimeError("the default voice needs espeakng-loader (pip install espeakng-loader)") from exc
            handle = ctypes.CDLL(espeakng_loader.get_library_path())
            _declare(handle)
            rate = handle.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
            if rate <= 0:
                raise RuntimeError(f"espeak_Initialize failed ({rate})")
            handle.espeak_SetSynthCallback(_on_samples)
            _lib, _rate_hz = handle, rate
        return _lib


def sample_rate() -> int:
    """The rate espeak-ng synthesizes at (22,050 Hz)."""
    lib()
    return _rate_hz


def _declare(handle: ctypes.CDLL) -> None:
    handle.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    handle.espeak_Initialize.restype = ctypes.c_int
    handle.espeak_SetSynthCallback.argtypes = [SYNTH_CALLBACK]
    handle.espeak_SetSynthCallback.restype = None
    handle.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    handle.espeak_SetVoiceByName.restype = ctypes.c_int
    handle.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    handle.espeak_SetParameter.restype = ctypes.c_int
    handle.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                    ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    handle.espeak_Synth.restype = ctypes.c_int
    handle.espeak_Synchronize.restype = ctypes.c_int
    handle.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
    handle.espeak_TextToPhonemes.restype = ctypes.c_char_p


FILE_NAMES = {"en-gb": "en"}  # voices whose file is not named after their language tag (espeak-ng -v maps these)


def set_voice(name: str) -> None:
    """"en-us", "en-gb+f3": a language voice, and a variant after the plus."""
    language, plus, variant = name.partition("+")
    file_name = FILE_NAMES.get(language.lower(), language) + plus + variant
    if lib().espeak_SetVoiceByName(file_name.encode()) != 0:
        raise ValueError(f"espeak-ng has no voice {name!r}")


def set_parameter(parameter: int, value: int) -> None:
    lib().espeak_SetParameter(parameter, int(value), 0)


def synth(text: str) -> np.ndarray:
    """int16 samples at sample_rate() for `text` with the voice and parameters set (hold `lock`)."""
    handle = lib()
    data = text.encode("utf-8") + b"\0"
    buffer = ctypes.create_string_buffer(data)
    _chunks.clear()
    error = handle.espeak_Synth(buffer, len(data), 0, POS_CHARACTER, 0, CHARS_UTF8, None, None)
    if error != 0:
        raise RuntimeError(f"espeak_Synth failed ({error})")
    handle.espeak_Synchronize()
    samples = np.concatenate(_chunks) if _chunks else np.zeros(0, dtype=np.int16)
    _chunks.clear()
    return samples


def phonemize(text: str, voice: str = "en-us") -> str:
    """IPA phonemes for `text`, espeak-ng's clauses joined by a space (punctuation is not kept)."""
    with lock:
        handle = lib()
        set_voice(voice)
        buffer = ctypes.create_string_buffer(text.encode("utf-8"))
        pointer = ctypes.c_char_p(ctypes.addressof(buffer))
        clauses = []
        while pointer.value:  # each call reads one clause and moves the pointer past it (NULL at the end)
            out = handle.espeak_TextToPhonemes(ctypes.byref(pointer), CHARS_UTF8, PHONEMES_IPA)
            if out:
                clauses.append(out.decode("utf-8").strip())
        return " ".join(c for c in clauses if c)
