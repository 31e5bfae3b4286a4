#include "framework/plugin/loader.h"

#include <dlfcn.h>

#include <boost/dll/shared_library.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "hp/plugin/api_hash.h"
#include "framework/util/build_info.h"
#include "framework/util/strings.h"

namespace fs = std::filesystem;

namespace hp {

namespace {
const std::string kPrefix = "libhp_feature_";
const std::string kSuffix = ".so";

std::string this_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&this_library_dir), &info) && info.dli_fname) {
    return fs::path(info.dli_fname).parent_path().string();
  }
  return "";
}
}  // namespace

PluginLoader::PluginLoader(std::vector<std::string> search_path)
    : search_path_(std::move(search_path)) {}

std::string PluginLoader::library_file_name(const std::string& feature) {
  return kPrefix + feature + kSuffix;
}

std::vector<std::string> PluginLoader::default_search_path(
    const std::vector<std::string>& config_paths) {
  std::vector<std::string> out = config_paths;
  if (const char* env = std::getenv("HP_PLUGIN_PATH")) {
    for (const auto& p : split(env, ':')) {
      if (!p.empty()) out.push_back(p);
    }
  }
  const std::string lib_dir = this_library_dir();
  if (!lib_dir.empty()) {
    out.push_back((fs::path(lib_dir) / ".." / "plugins").lexically_normal().string());  // build tree
    out.push_back((fs::path(lib_dir) / "hyperparallel" / "plugins").lexically_normal().string());
  }
  out.push_back(build_info::install_plugin_dir());
  // Drop repeats, keep order.
  std::vector<std::string> unique;
  for (auto& p : out) {
    if (std::find(unique.begin(), unique.end(), p) == unique.end()) unique.push_back(p);
  }
  return unique;
}

std::vector<std::string> PluginLoader::available() const {
  std::vector<std::string> names;
  for (const auto& dir : search_path_) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string f = e.path().filename().string();
      if (f.size() > kPrefix.size() + kSuffix.size() && f.rfind(kPrefix, 0) == 0 &&
          f.compare(f.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
        std::string n = f.substr(kPrefix.size(), f.size() - kPrefix.size() - kSuffix.size());
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
      }
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

LoadedFeature PluginLoader::load(const std::string& name) const {
  const std::string file = library_file_name(name);
  std::string path;
  for (const auto& dir : search_path_) {
    std::error_code ec;
    fs::path p = fs::path(dir) / file;
    if (fs::exists(p, ec)) {
      path = p.string();
      break;
    }
  }
  if (path.empty()) {
    auto found = available();
    std::string dym = did_you_mean(name, found);
    throw PluginError("no such feature '" + name + "': no " + file + " in [" +
                      join(search_path_) + "]" +
                      (dym.empty() ? "" : "; did you mean '" + dym + "'?") +
                      " (features found: " + (found.empty() ? "none" : join(found)) + ")");
  }

  // A library once loaded stays loaded for the process: a tool that checks
  // hundreds of configs (hp-plan, hp-sweep --dry-run) would otherwise map,
  // relocate against LibTorch's symbols and unmap every plugin per config
  // (12 ms a config at 4 ranks, 80 % of it the dynamic loader).
  // Never destroyed: nothing is unloaded at exit under a live object.
  static std::mutex loaded_mutex;
  static auto* loaded = new std::map<std::string, std::shared_ptr<boost::dll::shared_library>>();
  std::unique_lock<std::mutex> hold(loaded_mutex);
  auto& cached = (*loaded)[path];
  if (!cached) cached = std::make_shared<boost::dll::shared_library>();
  const std::shared_ptr<boost::dll::shared_library> lib = cached;
  try {
    if (!lib->is_loaded()) lib->load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception&) {
    // Boost's message hides dlerror's text; ask the loader directly.
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string cause = h ? "unknown reason" : dlerror();
    if (h) dlclose(h);
    throw PluginError("feature '" + name + "': cannot load " + path + ": " + cause);
  }
  hold.unlock();
  if (!lib->has(plugin_abi::kApiVersionSymbol) || !lib->has(plugin_abi::kCreateSymbol)) {
    std::string missing = !lib->has(plugin_abi::kApiVersionSymbol) ? plugin_abi::kApiVersionSymbol
                                                                   : plugin_abi::kCreateSymbol;
    throw PluginError("feature '" + name + "': " + path +
                      " is not a hyperparallel feature plugin: entry point '" + missing +
                      "' is missing (a plugin exports it with HP_FEATURE_PLUGIN)");
  }
  const int version = lib->get_alias<const int>(plugin_abi::kApiVersionSymbol);
  if (version != kFeatureApiVersion) {
    throw PluginError("feature '" + name + "': " + path + " was built for plugin API version " +
                      std::to_string(version) + ", but this hyperparallel " +
                      build_info::version() + " needs version " +
                      std::to_string(kFeatureApiVersion) +
                      "; rebuild the plugin against this hyperparallel");
  }
  const std::string hash = lib->has(plugin_abi::kApiHashSymbol)
                               ? std::string(lib->get_alias<const char* const>(plugin_abi::kApiHashSymbol))
                               : std::string("none");
  if (hash != HP_FEATURE_API_HASH) {
    throw PluginError("feature '" + name + "': " + path + " was built against plugin headers with API hash " + hash +
                      ", but this hyperparallel " + build_info::version() + " has API hash " +
                      HP_FEATURE_API_HASH + " (both at version " + std::to_string(kFeatureApiVersion) +
                      "); rebuild the plugin against this hyperparallel");
  }
  auto& create = lib->get_alias<plugin_abi::CreateFn>(plugin_abi::kCreateSymbol);
  std::string error;
  Feature* raw = create(&error);
  if (!raw) {
    throw PluginError("feature '" + name + "': the plugin's constructor failed in " + path + ": " +
                      (error.empty() ? "no reason given" : error));
  }
  std::shared_ptr<Feature> feature(raw, [lib](Feature* f) { delete f; });
  return LoadedFeature{name, path, std::move(feature)};
}

}  // namespace hp
