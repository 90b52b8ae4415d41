# bash completion for gpumemctl, the administrators' CLI of gpumemd.
_gpumemctl() {
    local cur prev words cword
    _init_completion || return

    local commands="status topology clients allocations quota shared disconnect metrics log-level ping cdi"
    local opts="--socket --json --version --help"
    local i cmd=""
    for ((i = 1; i < cword; i++)); do
        case "${words[i]}" in
            --socket|-s) ((i++)) ;;
            -*) ;;
            *) cmd="${words[i]}"; break ;;
        esac
    done

    if [[ $prev == --socket || $prev == -s ]]; then
        _filedir
        return
    fi
    if [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "$commands $opts" -- "$cur"))
        return
    fi
    case "$cmd" in
        topology) COMPREPLY=($(compgen -W "--properties" -- "$cur")) ;;
        allocations) [[ $prev == --client ]] || COMPREPLY=($(compgen -W "--client" -- "$cur")) ;;
        shared) ((cword == i + 1)) && COMPREPLY=($(compgen -W "list revoke" -- "$cur")) ;;
        log-level) COMPREPLY=($(compgen -W "err warning notice info debug" -- "$cur")) ;;
        cdi) COMPREPLY=($(compgen -W "--kind --name --socket-path --container-path" -- "$cur")) ;;
        quota)
            local sub="${words[i + 1]}"
            if ((cword == i + 1)); then
                COMPREPLY=($(compgen -W "show set" -- "$cur"))
            elif [[ $sub == set ]] && ((cword == i + 3)); then
                COMPREPLY=($(compgen -W "vram host managed handles fds connections inflight windows queues mappings shares" -- "$cur"))
            elif [[ $sub == set ]] && ((cword > i + 4)); then
                COMPREPLY=($(compgen -W "--gpu --force" -- "$cur"))
            fi
            ;;
    esac
}
complete -F _gpumemctl gpumemctl
