// pss/transport/tcp/tls.hpp: mutual TLS for TcpTransport: credentials, a throwaway cluster CA, and the task a certificate names.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>

// PSS_NO_TLS leaves TLS out (no OpenSSL needed to compile or link): every link is plaintext, and a
// TcpTransport says so on standard error when it starts.
#if !defined(PSS_NO_TLS)
#define PSS_HAS_TLS 1
#include <asio.hpp>
#include <asio/ssl.hpp>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#else
#define PSS_HAS_TLS 0
#endif

PSS_NAMESPACE_BEGIN

/// @brief A task's TLS identity, as PEM text: the cluster's CA certificate, the task's certificate (signed
/// by that CA, naming the task in a subjectAltName URI `pss:/job:ps/replica:0/task:1`) and its private key.
struct TlsCredentials {
    std::string ca;           ///< the CA certificate(s) a peer's certificate must chain to
    std::string certificate;  ///< this task's certificate (and any intermediate ones)
    std::string private_key;  ///< this task's key

    /// @brief Reads the three PEM files; `source` says where their names came from, for messages.
    /// @throws NotFoundError `pss: TLS: cannot read the CA certificate "/etc/pss/ca.crt" (from PSS_TLS_CA)`
    static TlsCredentials from_files(const std::string& ca, const std::string& certificate, const std::string& key,
                                     const std::string& source = "") {
        return {read_file(ca, "the CA certificate", source), read_file(certificate, "the certificate", source),
                read_file(key, "the private key", source)};
    }

private:
    static std::string read_file(const std::string& path, const char* what, const std::string& source) {
        std::ifstream in(path, std::ios::binary);
        if (!in)
            throw NotFoundError("pss: TLS: cannot read " + std::string(what) + " \"" + path + "\"" +
                                (source.empty() ? "" : " (from " + source + ")"));
        std::ostringstream text;
        text << in.rdbuf();
        return std::move(text).str();
    }
};

namespace detail {

#if PSS_HAS_TLS
/// The TLS context of a transport's links; null for plaintext.
using TlsContext = std::shared_ptr<asio::ssl::context>;
#else
using TlsContext = std::shared_ptr<void>;
#endif

/// The URI a certificate names its task by: `pss:/job:ps/replica:0/task:1`.
inline std::string task_uri(const TaskId& task) { return "pss:" + task.to_string(); }

/// The task a `pss:` URI names, or none when it is not one.
inline std::optional<TaskId> task_of_uri(std::string_view uri) {
    constexpr std::string_view prefix = "pss:/job:", middle = "/replica:0/task:";
    if (!uri.starts_with(prefix)) return std::nullopt;
    uri.remove_prefix(prefix.size());
    const auto slash = uri.find('/');
    if (slash == 0 || slash == std::string_view::npos) return std::nullopt;
    TaskId task{std::string(uri.substr(0, slash)), 0};
    for (std::size_t i = 0; i < task.type.size(); ++i) {
        const char c = task.type[i];
        const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!letter && (i == 0 || !((c >= '0' && c <= '9') || c == '_'))) return std::nullopt;
    }
    uri.remove_prefix(slash);
    if (!uri.starts_with(middle)) return std::nullopt;
    uri.remove_prefix(middle.size());
    if (uri.empty() || uri.size() > 9 || (uri.size() > 1 && uri.front() == '0')) return std::nullopt;
    for (const char c : uri) {
        if (c < '0' || c > '9') return std::nullopt;
        task.index = task.index * 10 + (c - '0');
    }
    return task;
}

}  // namespace detail

#if PSS_HAS_TLS

namespace detail {

struct OpenSslFree {
    void operator()(X509* p) const noexcept { X509_free(p); }
    void operator()(EVP_PKEY* p) const noexcept { EVP_PKEY_free(p); }
    void operator()(BIO* p) const noexcept { BIO_free(p); }
    void operator()(GENERAL_NAMES* p) const noexcept { GENERAL_NAMES_free(p); }
    void operator()(BIGNUM* p) const noexcept { BN_free(p); }
};
template <class T>
using OpenSslPtr = std::unique_ptr<T, OpenSslFree>;

/// OpenSSL's last error, for a message.
inline std::string openssl_error() {
    const unsigned long code = ERR_get_error();
    ERR_clear_error();
    if (code == 0) return "unknown OpenSSL error";
    char text[256];
    ERR_error_string_n(code, text, sizeof text);
    return text;
}

inline void openssl_check(bool ok, const char* what) {
    if (!ok) throw InternalError(std::string("pss: TLS: ") + what + " failed: " + openssl_error());
}

/// The task `certificate` names (its one `pss:` subjectAltName URI), or none.
inline std::optional<TaskId> certificate_task(X509* certificate) {
    if (certificate == nullptr) return std::nullopt;
    OpenSslPtr<GENERAL_NAMES> names(
        static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(certificate, NID_subject_alt_name, nullptr, nullptr)));
    if (!names) return std::nullopt;
    std::optional<TaskId> task;
    for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
        const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
        if (name->type != GEN_URI) continue;
        const ASN1_IA5STRING* text = name->d.uniformResourceIdentifier;
        const std::string_view uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(text)),
                                   static_cast<std::size_t>(ASN1_STRING_length(text)));
        if (!uri.starts_with("pss:")) continue;
        auto named = task_of_uri(uri);
        if (!named || task) return std::nullopt;  // a malformed or second task name: no identity
        task = std::move(named);
    }
    return task;
}

/// The task the peer of `ssl` proved it is, or none.
inline std::optional<TaskId> peer_task(SSL* ssl) {
    OpenSslPtr<X509> certificate(SSL_get1_peer_certificate(ssl));
    return certificate_task(certificate.get());
}

/// The task the certificate of `context` names.
/// @throws InvalidArgumentError when it names none
inline TaskId context_task(asio::ssl::context& context) {
    auto task = certificate_task(SSL_CTX_get0_certificate(context.native_handle()));
    if (!task)
        throw InvalidArgumentError(
            "pss: TLS: the task's certificate names no task: it needs one subjectAltName URI "
            "\"pss:/job:<job>/replica:0/task:<index>\" (TlsAuthority::issue and pss-launch make such certificates)");
    return *task;
}

/// A TLS context for both ends of a task's links: TLS 1.3 only, AES-GCM first, the peer's certificate
/// required and checked against the CA.
/// @throws InvalidArgumentError naming the part of `credentials` that OpenSSL refused
inline std::shared_ptr<asio::ssl::context> make_tls_context(const TlsCredentials& credentials) {
    auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
    SSL_CTX* native = context->native_handle();
    openssl_check(SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION) == 1, "SSL_CTX_set_min_proto_version");
    openssl_check(SSL_CTX_set_ciphersuites(native, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                                                   "TLS_CHACHA20_POLY1305_SHA256") == 1,
                  "SSL_CTX_set_ciphersuites");
    SSL_CTX_set_num_tickets(native, 0);  // links are long-lived and never resumed
    auto load = [&](const char* what, auto step) {
        try {
            step();
        } catch (const std::system_error& e) {
            ERR_clear_error();
            throw InvalidArgumentError(std::string("pss: TLS: ") + what + " was refused: " + e.what());
        }
    };
    load("the CA certificate", [&] { context->add_certificate_authority(asio::buffer(credentials.ca)); });
    load("the task's certificate", [&] { context->use_certificate_chain(asio::buffer(credentials.certificate)); });
    load("the private key", [&] { context->use_private_key(asio::buffer(credentials.private_key), asio::ssl::context::pem); });
    if (SSL_CTX_check_private_key(native) != 1) {
        ERR_clear_error();
        throw InvalidArgumentError("pss: TLS: the private key does not belong to the task's certificate");
    }
    context->set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
    return context;
}

}  // namespace detail

/// @brief A cluster's certificate authority, made on the spot: it issues each task a certificate naming
/// the task. pss-launch makes one per run; tests make their own. Its key lives in memory only.
class TlsAuthority {
public:
    /// @brief A new CA (an EC P-256 key, a self-signed certificate valid `days` days).
    explicit TlsAuthority(std::string name = "pss cluster CA", int days = 30) : days_(days) {
        key_ = new_key();
        certificate_ = new_certificate(key_.get(), name, nullptr);
        add_extension(certificate_.get(), certificate_.get(), NID_basic_constraints, "critical,CA:TRUE");
        add_extension(certificate_.get(), certificate_.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
        add_extension(certificate_.get(), certificate_.get(), NID_subject_key_identifier, "hash");
        detail::openssl_check(X509_sign(certificate_.get(), key_.get(), EVP_sha256()) > 0, "X509_sign");
        pem_ = certificate_pem(certificate_.get());
    }

    /// @brief The CA certificate, PEM: what every task checks its peers' certificates against.
    [[nodiscard]] const std::string& certificate() const noexcept { return pem_; }

    /// @brief Credentials for `task`: a new key and a certificate naming the task, signed by this CA.
    [[nodiscard]] TlsCredentials issue(const TaskId& task) const {
        auto key = new_key();
        auto certificate = new_certificate(key.get(), task.to_string(), certificate_.get());
        add_extension(certificate.get(), certificate_.get(), NID_basic_constraints, "critical,CA:FALSE");
        add_extension(certificate.get(), certificate_.get(), NID_key_usage, "critical,digitalSignature");
        add_extension(certificate.get(), certificate_.get(), NID_ext_key_usage, "serverAuth,clientAuth");
        add_extension(certificate.get(), certificate_.get(), NID_subject_alt_name,
                      ("URI:" + detail::task_uri(task)).c_str());
        detail::openssl_check(X509_sign(certificate.get(), key_.get(), EVP_sha256()) > 0, "X509_sign");
        detail::OpenSslPtr<BIO> bio(BIO_new(BIO_s_mem()));
        detail::openssl_check(PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1,
                              "PEM_write_bio_PrivateKey");
        return {pem_, certificate_pem(certificate.get()), bio_text(bio.get())};
    }

    /// @brief Writes what PSS_TLS_DIR names into the existing directory `dir`: ca.crt, and each of `tasks`'
    /// `<job>-<index>.crt` and `<job>-<index>.key`, every file readable by its owner only.
    /// @throws UnavailableError `pss: TLS: cannot write "/tmp/certs/ps-0.key"`
    template <class Tasks>
    void write_directory(const std::filesystem::path& dir, const Tasks& tasks) const {
        auto write = [&](const std::string& name, const std::string& text) {
            const auto path = dir / name;
            {
                std::ofstream file(path, std::ios::binary | std::ios::trunc);
                std::error_code ec;
                std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write, ec);
                if (!(file << text) || ec) throw UnavailableError("pss: TLS: cannot write \"" + path.string() + "\"");
            }
        };
        write("ca.crt", pem_);
        for (const TaskId& task : tasks) {
            const auto credentials = issue(task);
            const std::string base = task.type + "-" + std::to_string(task.index);
            write(base + ".crt", credentials.certificate);
            write(base + ".key", credentials.private_key);
        }
    }

private:
    static detail::OpenSslPtr<EVP_PKEY> new_key() {
        detail::OpenSslPtr<EVP_PKEY> key(EVP_EC_gen("P-256"));
        detail::openssl_check(key != nullptr, "EVP_EC_gen");
        return key;
    }

    /// An unsigned certificate for `key`, issued by `issuer` (itself when null).
    detail::OpenSslPtr<X509> new_certificate(EVP_PKEY* key, const std::string& common_name, X509* issuer) const {
        detail::OpenSslPtr<X509> certificate(X509_new());
        X509* x = certificate.get();
        detail::openssl_check(x != nullptr && X509_set_version(x, 2) == 1, "X509_new");
        detail::OpenSslPtr<BIGNUM> serial(BN_new());
        detail::openssl_check(serial && BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
                                  BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(x)) != nullptr,
                              "the serial number");
        X509_gmtime_adj(X509_getm_notBefore(x), -3600);  // a peer whose clock is a little behind
        X509_gmtime_adj(X509_getm_notAfter(x), static_cast<long>(days_) * 86400);
        detail::openssl_check(X509_set_pubkey(x, key) == 1, "X509_set_pubkey");
        X509_NAME* name = X509_get_subject_name(x);
        detail::openssl_check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                                         reinterpret_cast<const unsigned char*>(common_name.c_str()),
                                                         -1, -1, 0) == 1,
                              "the subject name");
        detail::openssl_check(X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name) == 1,
                              "the issuer name");
        return certificate;
    }

    static void add_extension(X509* certificate, X509* issuer, int nid, const char* value) {
        X509V3_CTX context;
        X509V3_set_ctx(&context, issuer, certificate, nullptr, nullptr, 0);
        X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
        detail::openssl_check(extension != nullptr, "an X.509 extension");
        const int added = X509_add_ext(certificate, extension, -1);
        X509_EXTENSION_free(extension);
        detail::openssl_check(added == 1, "X509_add_ext");
    }

    static std::string certificate_pem(X509* certificate) {
        detail::OpenSslPtr<BIO> bio(BIO_new(BIO_s_mem()));
        detail::openssl_check(PEM_write_bio_X509(bio.get(), certificate) == 1, "PEM_write_bio_X509");
        return bio_text(bio.get());
    }

    static std::string bio_text(BIO* bio) {
        char* data = nullptr;
        const long size = BIO_get_mem_data(bio, &data);
        return std::string(data, static_cast<std::size_t>(size));
    }

    int days_;
    detail::OpenSslPtr<EVP_PKEY> key_;
    detail::OpenSslPtr<X509> certificate_;
    std::string pem_;
};

#endif  // PSS_HAS_TLS

PSS_NAMESPACE_END
