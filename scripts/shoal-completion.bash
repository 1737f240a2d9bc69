# bash completion for shoal.  Commands and options come from the binary's
# own help (`shoal help`, `shoal CMD --help`), read once per shell.
# Installed by `make install` into share/bash-completion/completions/shoal.
_shoal_words() {
    # $1: "" for the command list, else a command (or "bench NAME").
    local key="_shoal_cache_${1// /_}"
    key=${key//-/_}
    if [[ -z ${!key+x} ]]; then
        local words
        if [[ -z $1 ]]; then
            words=$(shoal help 2>/dev/null | sed -n '/^commands:/,/^$/s/^  \([a-z-]*\) .*/\1/p')
            words="$words bench help --version"
        elif [[ $1 == bench ]]; then
            words=$(shoal bench --help 2>/dev/null | sed -n 's/^  \([a-z-]*\) .*/\1/p')
        else
            words=$(shoal $1 --help 2>&1 | grep -o -- '--[a-z0-9][a-z0-9-]*' | sort -u)
            words="$words --help"
        fi
        printf -v "$key" '%s' "$words"
    fi
    printf '%s' "${!key}"
}

# The subcommands of command $1, from its usage lines ("shoal store ls ...",
# "shoal rl trainer|worker ..."); empty for a command without any.
_shoal_subs() {
    local key="_shoal_subs_${1//-/_}"
    if [[ -z ${!key+x} ]]; then
        local words
        words=$(shoal $1 --help 2>&1 | grep -o -- "shoal $1 [a-z][a-z0-9|-]*" | sed "s/^shoal $1 //" | tr '|' '\n' | sort -u)
        printf -v "$key" '%s' "$words"
    fi
    printf '%s' "${!key}"
}

_shoal() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    if ((COMP_CWORD == 1)); then
        COMPREPLY=($(compgen -W "$(_shoal_words "")" -- "$cur"))
        return
    fi
    local cmd=${COMP_WORDS[1]}
    if [[ $cmd == bench ]]; then
        if ((COMP_CWORD == 2)); then
            COMPREPLY=($(compgen -W "$(_shoal_words bench)" -- "$cur"))
            return
        fi
        cmd="bench ${COMP_WORDS[2]}"
    else
        # A subcommand first, then its own options (`shoal rl train --help`).
        local subs
        subs=$(_shoal_subs "$cmd")
        if ((COMP_CWORD == 2)) && [[ -n $subs && $cur != -* ]]; then
            COMPREPLY=($(compgen -W "$subs" -- "$cur"))
            return
        fi
        if ((COMP_CWORD > 2)) && [[ $'\n'$subs$'\n' == *$'\n'${COMP_WORDS[2]}$'\n'* ]]; then
            cmd="$cmd ${COMP_WORDS[2]}"
        fi
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_shoal_words "$cmd")" -- "$cur"))
    else
        case $prev in
            --state) COMPREPLY=($(compgen -W "pending starting running succeeded failed cancelled active" -- "$cur")) ;;
            --sandbox) COMPREPLY=($(compgen -W "auto bwrap gvisor none" -- "$cur")) ;;
            --server|--token|--name|--zone|--fabric|--price|--limit|--rank) COMPREPLY=() ;;
            *) COMPREPLY=($(compgen -f -- "$cur")) ;;
        esac
    fi
}
complete -F _shoal shoal
